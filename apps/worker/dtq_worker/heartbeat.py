"""The heartbeat loop: the liveness hash, the leases of the runs in flight (their touch), and
the self-stop when no beat gets through."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.declared import TASKS_FIELD
from dtq.errors import ConfigError
from dtq.store import eviction
from dtq.store.connection import is_cluster
from dtq_worker import poolchild
from dtq_worker.faults import Backoff, is_transient

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv
    from dtq_worker.runs import Runs
    from dtq_worker.slots import Run

log = logging.getLogger("dtq.heartbeat")
EVICTING_REMIND_S = 60.0  # the error is logged again this often while Redis evicts
STOPPING = ("draining", "stopped")


class IdStillHeld(Exception):
    """The worker id stayed held by a live, stopping worker past the wait (exit code 4)."""


class Heartbeat:
    def __init__(
        self,
        env: WorkerEnv,
        runs: Runs,
        tasks: Mapping[str, Any],
        counters: dict[str, int],
        *,
        on_beat: Callable[[], None],
        self_stop: Callable[[], None],
        schedules: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``tasks`` and ``schedules`` (queue -> names) are declared with every beat; ``on_beat()``
        follows each beat Redis took, ``self_stop()`` none for the TTL; ``runs`` hears touches."""
        self.env = env
        self.runs = runs
        self.slots = runs.slots
        self.tasks = tasks
        self.counters = counters
        self.schedules = schedules or {}
        self._on_beat = on_beat
        self._self_stop = self_stop
        self.pid = os.getpid()
        self.last_ok = time.monotonic()
        self.started_at = int(time.time() * 1000)
        self.backoff = Backoff(log, "heartbeat")
        self.publish = True  # the owner and task names go with the next beat
        self._evicting_logged = 0.0
        env.metrics.heartbeat_age.set_function(self.age)

    def age(self) -> float:
        """Seconds since the last heartbeat Redis took (since start before the first)."""
        return time.monotonic() - self.last_ok

    async def loop(self) -> None:
        env = self.env
        interval = env.settings.heartbeat_interval_s
        failing_since: float | None = None
        while not env.finished:
            began = time.monotonic()
            ok = await self.beat()
            # The TTL counts from the first failed attempt: a process that was frozen must not
            # stop itself on one failed beat after it resumes.
            if ok:
                failing_since = None
                self._on_beat()
                await self._watch_eviction()
            elif failing_since is None:
                failing_since = began
            failed_for = 0.0 if failing_since is None else time.monotonic() - failing_since
            if failed_for > env.settings.effective_heartbeat_ttl_s:
                log.error(
                    "no heartbeat succeeded for %.1fs (heartbeat TTL): stopping this worker",
                    failed_for,
                )
                self._self_stop()
                return
            pause = interval * random.uniform(0.8, 1.0) if ok else min(interval, 0.5)
            await env.sleep_until_finished(pause)

    async def _watch_eviction(self) -> None:
        """Re-read Redis's maxmemory-policy: under ``allkeys-*`` claims stop (``env.evicting``)
        and /readyz fails until it is fixed; runs in flight finish."""
        env = self.env
        try:
            policy = await eviction.eviction_policy(env.redis)
        except Exception as exc:  # the next beat reads it again
            if not is_transient(exc):
                raise
            return
        now = time.monotonic()
        if eviction.refusal(policy):
            if env.evicting is None or now - self._evicting_logged >= EVICTING_REMIND_S:
                log.error(
                    "%s: this worker stopped claiming until it is (runs in flight finish)",
                    eviction.refusal(policy),
                )
                self._evicting_logged = now
            env.evicting = policy
        elif env.evicting is not None:
            log.warning(
                "Redis maxmemory-policy is %s now (was %s): claiming again", policy, env.evicting
            )
            env.evicting = None

    def owner(self) -> str:
        return f"{socket.gethostname()}:{self.pid}"

    async def claim_id(self) -> bool:
        """Start under this worker id once no live worker of another process holds it; False
        when stopped while waiting (the waits and their ends: docs/faults.md, exit codes 2, 4)."""
        env, s = self.env, self.env.settings
        began = time.monotonic()
        waiting = False
        while True:
            held = await self._try_claim()
            if held is None:
                if waiting:
                    log.info("worker id %r is free now: starting", env.worker_id)
                return True
            host, pid, status = held
            waited = time.monotonic() - began
            if status not in STOPPING and waited >= s.effective_heartbeat_ttl_s:
                raise ConfigError(
                    f"worker id {env.worker_id!r} is in use by a live worker (pid {pid} on "
                    f"{host}): give each worker its own --worker-id / DTQ_WORKER_ID"
                )
            if waited >= self.claim_wait_s():
                raise IdStillHeld(
                    f"worker id {env.worker_id!r} is still held by pid {pid} on {host} "
                    f"({status or 'starting'}) after {waited:.0f}s: exiting (code 4)"
                )
            if not waiting:
                log.warning(
                    "worker id %r is held by pid %s on %s (%s): waiting up to %.0fs for it to stop",
                    env.worker_id,
                    pid,
                    host,
                    status or "starting",
                    self.claim_wait_s(),
                )
                waiting = True
            await env.sleep(min(s.heartbeat_interval_s, 1.0))
            if env.stopping:
                return False

    def claim_wait_s(self) -> float:
        """How long a start waits for a stopping holder of its id: drain, hard exit, one TTL."""
        s = self.env.settings
        return s.drain_timeout_s + s.hard_exit_s + s.effective_heartbeat_ttl_s

    async def _try_claim(self) -> tuple[str, str, str | None] | None:
        """Claim the id (None), or the live holder's host, pid and heartbeat status."""
        env, me = self.env, self.owner()
        key = env.keys.worker(env.worker_id)
        async with env.redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, "owner", me)
            pipe.hmget(key, "owner", "status")
            pipe.pttl(key)
            _, (holder, status), ttl = await pipe.execute()
        if holder != me:
            host, _, pid = (holder or "").rpartition(":")
            if ttl > 0 and not (host == socket.gethostname() and poolchild.pid_gone(pid)):
                return host, pid, status
            await env.redis.hset(key, "owner", me)  # its holder is gone: take it over
        if ttl < 0 or holder != me:  # it expires like a heartbeat unless beats follow
            await env.redis.pexpire(key, int(env.settings.heartbeat_interval_s * 3000))
        return None

    async def beat(self, status: str | None = None) -> bool:
        """One heartbeat; True when Redis took it."""
        sent = time.monotonic()
        by_queue: dict[str, list[Run]] = defaultdict(list)
        for r in self.slots.inflight.values():
            by_queue[r.claimed.queue].append(r)
        published, active = self.publish, len(self.slots.inflight)  # (another beat may run)
        try:
            replies = await self._send(by_queue, active, status, published)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.env.metrics.redis_errors.labels("heartbeat").inc()
            self.backoff.failed(exc)
            self.publish = True
            self.env.healthy.clear()
            return False
        self._took(replies, published, by_queue, sent)
        return True

    def _fields(self, now_ms: int, active: int, status: str | None) -> dict[str, Any]:
        """The liveness hash's fields that every beat writes."""
        env = self.env
        return {
            "worker_id": env.worker_id,
            "hostname": socket.gethostname(),
            "pid": self.pid,
            "queues": ",".join(env.queues),
            "started_at": self.started_at,
            "last_heartbeat": now_ms,
            "heartbeat_interval_ms": int(env.settings.heartbeat_interval_s * 1000),
            "active_tasks": active,
            "concurrency": env.settings.worker_concurrency,
            "tasks_processed": self.counters.get("succeeded", 0),
            "tasks_failed": self.counters.get("failed", 0),
            "tasks_retried": self.counters.get("retried", 0),
            "status": status or ("draining" if env.stopping else "busy" if active else "ready"),
        }

    async def _send(
        self, by_queue: Mapping[str, list[Run]], active: int, status: str | None, published: bool
    ) -> list[Any]:
        """One pipeline: the liveness hash (the owner and task names when ``published``), its
        TTL, the workers index, one touch per queue with runs, the declarations, then TIME."""
        env = self.env
        if env.clock.offset_ms is None:
            env.clock.set(await env.redis.time())
        now_ms = env.clock.now_ms()
        async with env.redis.pipeline(transaction=False) as pipe:
            key = env.keys.worker(env.worker_id)
            pipe.hset(key, mapping=self._fields(now_ms, active, status))
            if published:
                names = json.dumps(sorted(self.tasks))
                pipe.hset(key, mapping={"owner": self.owner(), TASKS_FIELD: names})
            pipe.pexpire(key, int(env.settings.heartbeat_interval_s * 3000))
            pipe.zadd(env.keys.workers, {env.worker_id: now_ms})
            for q, q_runs in by_queue.items():
                refs = [r.ref for r in q_runs]
                await env.scripts.run(sc.touch_call(env.keys.queue(q), env.worker_id, refs), pipe)
            for q in env.queues:  # what this worker declares, stamped (docs/operations.md)
                qk = env.keys.queue(q)
                if self.tasks:
                    pipe.hset(qk.decl_seen, mapping=dict.fromkeys(self.tasks, now_ms))
                if self.schedules.get(q):
                    pipe.hset(qk.schedules_seen, mapping=dict.fromkeys(self.schedules[q], now_ms))
            cluster = is_cluster(env.redis)
            if not cluster:
                pipe.time()
            replies: list[Any] = await pipe.execute()
        if cluster:  # (a cluster pipeline cannot route TIME)
            replies.append(await env.redis.time())
        return replies

    def _took(
        self, replies: list[Any], published: bool, by_queue: Mapping[str, list[Run]], sent: float
    ) -> None:
        """Apply a beat Redis took: the clock, the renewed leases, the touches' reports."""
        self.backoff.ok()
        if published:
            del replies[1]  # the HSET of the owner and the names
        # Fields new to the hash: it had expired, the owner and the names go with the next beat.
        self.publish = not published and int(replies[0]) > 0
        self.last_ok = time.monotonic()
        self.env.healthy.set()
        self.env.clock.set(replies[-1])
        touches = [sc.parse_touch(raw) for raw in replies[3 : 3 + len(by_queue)]]
        lost = {(q, tid) for q, t in zip(by_queue, touches, strict=True) for tid in t.lost}
        for q_runs in by_queue.values():
            for r in q_runs:
                # Renewed, unless reported lost (it must not look fresh to Slots.fill).
                if not lost or r.key not in lost:
                    r.leased_mono = sent
        for q, touch in zip(by_queue, touches, strict=True):
            self.apply_touch(q, touch, by_queue[q])
        if self.slots.ready:
            self.slots.fill()  # runs claimed ahead whose lease was too old to start

    def apply_touch(self, queue: str, res: sc.TouchResult, runs: list[Run]) -> None:
        by_tid, inflight = {r.claimed.tid: r for r in runs}, self.slots.inflight
        for tid in res.lost:
            run = by_tid.get(tid)
            if run is not None and run.stop_reason is None and inflight.get(run.key) is run:
                self.runs.lose(run, "was reclaimed by another worker")
        for tid in res.cancel_requested:
            self.runs.cancel(queue, tid)
