"""The worker process: owns the shared state and runs the supervised loops (supervisor.py)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aredis
import redis.exceptions as rex

from dtq import scripts as sc
from dtq.app import App
from dtq.declared import declarations
from dtq.errors import ConfigError, SchemaMismatch
from dtq.settings import Settings
from dtq.store import connection, eviction, partitions
from dtq.store.connection import default_url_warning, display_url
from dtq.store.keys import GROUP, SCHEMA_VERSION, Keys
from dtq_worker import poolchild
from dtq_worker.consumer import IDLE_WAIT_TIMEOUT_S, Consumer
from dtq_worker.env import WorkerEnv
from dtq_worker.faults import Backoff, is_transient
from dtq_worker.flowmover import FlowMover
from dtq_worker.health import HealthServer, loop_answers, metrics_note, served
from dtq_worker.heartbeat import Heartbeat
from dtq_worker.metrics import WorkerMetrics
from dtq_worker.reaper import Reaper
from dtq_worker.recovery import Recovery
from dtq_worker.runs import Runs
from dtq_worker.scheduler import Scheduler
from dtq_worker.slots import StopReason
from dtq_worker.supervisor import supervise

log = logging.getLogger("dtq.worker")

EXIT_OK, EXIT_REDIS_LOST, EXIT_CONFIG = 0, 1, 2
EXIT_HARD_IN_PROCESS = 3  # hard exit of a worker inside another program (tests): never 0
EXIT_ID_HELD = 4  # the worker id stayed held by a stopping worker (Heartbeat.claim_id)

# How long a starting worker retries a Redis that never answered (see prepare).
STARTUP_UNREACHED_S = 2.0


def _no_answer(exc: BaseException) -> bool:
    """Nothing answered: refused, reset, timed out (a LOADING reply is an answer)."""
    if isinstance(exc, rex.BusyLoadingError):
        return False
    return isinstance(exc, OSError | rex.ConnectionError | rex.TimeoutError)


def worker_clients(settings: Settings, queues: int) -> tuple[aredis.Redis, aredis.Redis]:
    """``(calls, blocking)`` for ``queues`` physical queues: a call waits up to twice the heartbeat
    interval (at least 5 s); on a cluster blocking reads hold two more connections per queue."""
    url, timeout = settings.redis_url, max(5.0, settings.heartbeat_interval_s * 2)
    both: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": min(timeout, 5.0)}
    calls = connection.async_redis(url, socket_timeout=timeout, **both)
    if connection.is_cluster_url(url):
        both["max_connections"] = connection.POOL_CONNECTIONS + 2 * queues
    blocking = connection.async_redis(url, socket_timeout=timeout + 2, **both)
    lane = settings.fast_lane
    sc.hiredis_packing(calls, fast_lane=lane)  # the batched script calls are long
    sc.hiredis_packing(blocking, fast_lane=lane)  # the idle XREAD names every band
    return calls, blocking


class Worker:
    def __init__(
        self, app: App, settings: Settings, queue_caps: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.worker_id = settings.worker_id
        self.queues = partitions.expand(settings.queues, settings.queue_partitions)
        self.queue_caps = {**settings.queue_concurrency, **(queue_caps or {})}
        self.keys = Keys(settings.key_prefix)
        self.redis, self.blocking = worker_clients(settings, len(self.queues))
        self.scripts = sc.AsyncScripts(self.redis, fast_lane=settings.fast_lane)
        self.metrics = WorkerMetrics(self.worker_id)
        self.env = env = WorkerEnv(
            settings, self.keys, self.redis, self.blocking, self.scripts, self.metrics
        )
        self.healthy = env.healthy
        self.pool = ThreadPoolExecutor(
            max_workers=settings.worker_concurrency, thread_name_prefix="dtq-task"
        )
        self.counters: dict[str, int] = {}  # outcomes so far (the heartbeat publishes them)
        self.runs = runs = Runs(env, app, self.pool, self.queue_caps, self.counters)
        self.slots = slots = runs.slots
        self.executor, self.outcomes = runs.executor, runs.outcomes
        self.metrics.inflight.set_function(lambda: len(slots.inflight))
        self.prepared = False
        self.http: HealthServer | None = None
        self._skip_drain = asyncio.Event()
        self._process = False  # owns_process(): this worker is the whole process
        self.recovery = Recovery(env, runs)
        self.consumer = Consumer(env, runs, self.recovery, self.ensure_groups)
        self.reaper = Reaper(env, self.ensure_groups)
        self.scheduler = Scheduler(env, app)
        self.heartbeat = Heartbeat(
            env,
            runs,
            app.tasks,
            self.counters,
            on_beat=self.recovery.tick,
            self_stop=self.self_stop,
            schedules=self.scheduler.periodic.names_by_queue(self.queues),
        )
        self.flows = FlowMover(env)
        self.scripts.on_reply_lost = self.recovery.reply_lost

    # --- start -----------------------------------------------------------------------------

    async def prepare(self) -> bool:
        """Check the schema version and create the streams and group; retry while unreachable.
        False when stopped while waiting for the worker id (Heartbeat.claim_id)."""
        s, backoff, began = self.settings, Backoff(log, "startup"), time.monotonic()
        # A Redis that never answered gets STARTUP_UNREACHED_S; one that answers with a
        # transient error (LOADING, a failover) the heartbeat TTL.
        never_reached = began + min(
            STARTUP_UNREACHED_S, s.heartbeat_interval_s, s.effective_heartbeat_ttl_s
        )
        reached = False
        while True:
            try:
                await self.redis.set(self.keys.schema, SCHEMA_VERSION, nx=True)
                found = await self.redis.get(self.keys.schema)
                if found != SCHEMA_VERSION:
                    raise SchemaMismatch(
                        f"Redis keyspace {self.keys.prefix!r} has schema version {found!r}; "
                        f"this dtq knows {SCHEMA_VERSION!r}"
                    )
                await self.check_eviction()
                if not await self.heartbeat.claim_id():
                    return False
                await self.ensure_groups()
                await partitions.aregister(self.redis, self.keys, s.queue_partitions, self.queues)
                sec, usec = await self.redis.time()
                self.recovery.since_ms = sec * 1000 + usec // 1000
                return True
            except (SchemaMismatch, ConfigError):
                raise
            except Exception as exc:
                reached = reached or not _no_answer(exc)
                deadline = began + s.effective_heartbeat_ttl_s if reached else never_reached
                left = deadline - time.monotonic()
                if not is_transient(exc) or left < 0:
                    raise
                await asyncio.sleep(min(backoff.failed(exc), left + 0.01))  # a last try at it

    async def check_eviction(self) -> None:
        """Refuse an ``allkeys-*`` maxmemory-policy, warn on ``volatile-*`` (dtq.store.eviction)."""
        policy = await eviction.eviction_policy(self.redis)
        if refused := eviction.refusal(policy):
            raise ConfigError(refused)
        if warned := eviction.warning(policy):
            log.warning("%s", warned)

    async def ensure_groups(self) -> None:
        """Create each queue's streams and group; publish the tasks' defaults (dtq.declared)."""
        decl = declarations((n, t.defaults) for n, t in self.app.tasks.items())
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in self.queues:
                qk = self.keys.queue(q)
                for stream in qk.streams:
                    pipe.xgroup_create(stream, GROUP, id="0", mkstream=True)
                if decl:
                    pipe.hset(qk.decl, mapping=decl)  # type: ignore[arg-type]
            replies = await pipe.execute(raise_on_error=False)
        for r in replies:
            if isinstance(r, Exception) and "BUSYGROUP" not in str(r):
                raise r

    # --- run -------------------------------------------------------------------------------

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()

        def handler(sig: int, _frame: Any) -> None:
            # (not loop.add_signal_handler: the hard-exit timer is armed even while a task
            # blocks the event loop)
            self._arm_hard_exit()
            # (in a context of its own: the signal may land inside a run's body)
            loop.call_soon_threadsafe(self.on_signal, sig, context=contextvars.Context())

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)

    def on_signal(self, sig: int) -> None:
        if not self.env.stopping:
            log.info(
                "%s: draining (up to %.0fs); send again to skip the drain",
                signal.Signals(sig).name,
                self.settings.drain_timeout_s,
            )
            self.initiate_shutdown()
        else:
            log.warning("second %s: skipping the drain", signal.Signals(sig).name)
            self._skip_the_drain()

    def initiate_shutdown(self) -> None:
        if not self.env.stop_event.is_set():
            self.env.stop_event.set()
            self.slots.begin_drain()
            self.consumer.interrupt()
            self._arm_hard_exit()

    def _arm_hard_exit(self) -> None:
        if getattr(self, "_hard_timer", None) is None:
            limit = self.settings.drain_timeout_s + self.settings.hard_exit_s
            self._hard_timer = threading.Timer(limit, self._hard_exit)
            self._hard_timer.daemon = True
            self._hard_timer.start()

    def self_stop(self) -> None:
        self.env.self_stopping = True
        self._skip_the_drain()
        self.initiate_shutdown()

    def _skip_the_drain(self) -> None:
        self._skip_drain.set()
        self.slots.changed.notify()  # the drain waits on the slots' changes

    def owns_process(self) -> None:
        """This worker is the process (dtq-worker): a hard exit after the drain exits 0."""
        self._process = True

    def _hard_exit(self) -> None:
        log.error("hard exit deadline (DTQ_HARD_EXIT_S) passed: exiting now")
        logging.shutdown()
        if not self._process:
            code = EXIT_HARD_IN_PROCESS
        else:
            code = EXIT_REDIS_LOST if self.env.self_stopping else EXIT_OK
        os._exit(code)

    async def run(self) -> int:
        """Run until shutdown; return the process exit code."""
        s = self.settings
        pool_port_file = poolchild.port_file()  # a --processes child: a private port
        if s.metrics_port or pool_port_file:  # up before prepare(): probes answer "not ready"
            self.http = HealthServer(
                self.metrics.registry, loop_answers(asyncio.get_running_loop()), self.readiness
            )
            if pool_port_file:
                self.http.start(0, "127.0.0.1")
                poolchild.publish_port(pool_port_file, self.http.port)
            else:
                self.http.start(s.metrics_port or 0)
        try:
            return await self._serve()
        finally:
            if self.http is not None:  # an in-process worker must free its port when it ends
                self.http.stop()
                self.http = None
            if (timer := getattr(self, "_hard_timer", None)) is not None:
                timer.cancel()  # stopped in time; an in-process worker must not end its host later

    async def _serve(self) -> int:
        s = self.settings
        if not await self.prepare():  # stopped while it waited for its id: it holds nothing
            await self._close()
            return EXIT_OK
        self.prepared = True
        self.healthy.set()
        if s.effective_heartbeat_ttl_s >= s.visibility_timeout_s:
            log.warning(
                "heartbeat TTL (%.1fs) >= visibility timeout (%.1fs): a worker cut off from "
                "Redis keeps running tasks that others may already have reclaimed",
                s.effective_heartbeat_ttl_s,
                s.visibility_timeout_s,
            )
        self.env.emit_event("worker_started", ",".join(self.queues))
        log.info("worker %s started: redis=%s prefix=%s queues=%s concurrency=%d %s%s",
                 self.worker_id, display_url(s.redis_url), s.key_prefix, ",".join(self.queues),
                 s.worker_concurrency, served(self.app.tasks),
                 metrics_note(s.metrics_port if poolchild.port_file() is None else None),
                 )  # fmt: skip
        if unset := default_url_warning(s):
            log.warning("%s", unset)
        env = self.env
        stopping, finished = (lambda: env.stopping), (lambda: env.finished)
        loops = [
            env.spawn(supervise(name, loop, until, self._restarted))
            for name, loop, until in (
                ("poll", self.consumer.loop, stopping),
                ("reaper", self.reaper.loop, stopping),
                ("scheduler", self.scheduler.loop, stopping),
                ("heartbeat", self.heartbeat.loop, finished),
                ("cancels", self._cancel_listener, stopping),
                ("flows", self.flows.loop, stopping),
            )
        ]
        await env.stop_event.wait()
        code = await self.shutdown()
        self.env.finished_event.set()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self._close()
        return code

    def readiness(self) -> str:
        """/readyz's answer (read from the probe's thread): "ok", or why not."""
        if self.env.stopping:
            return "draining"
        if not self.prepared:
            return "starting"
        if not self.healthy.is_set():
            return "redis unreachable"
        if self.env.evicting is not None:  # (Heartbeat._watch_eviction)
            return f"redis maxmemory-policy is {self.env.evicting}: not claiming"
        if self.heartbeat.age() > self.settings.effective_heartbeat_ttl_s:
            return "heartbeat stale"  # a beat hangs (Redis frozen): none landed for a TTL
        return "ok"

    def _restarted(self, loop: str, exc: BaseException) -> None:
        self.metrics.loop_restarts.labels(loop).inc()
        if is_transient(exc):
            self.metrics.redis_errors.labels(loop).inc()

    async def _cancel_listener(self) -> None:
        ps = self.blocking.pubsub()
        try:
            await ps.subscribe(self.keys.cancel_channel)
            while not self.env.stopping:
                msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg and msg.get("type") == "message":
                    self.runs.cancel(None, str(msg["data"]))
        finally:
            await ps.aclose()  # type: ignore[no-untyped-call]

    async def shutdown(self) -> int:
        s = self.settings
        drain = 0.0 if self._skip_drain.is_set() else s.drain_timeout_s
        deadline = time.monotonic() + drain
        # A claim in flight at the stop launches its runs when its reply comes: the drain
        # waits for it too.
        slots = self.slots
        while slots.busy and not self._skip_drain.is_set():
            if slots.ready:
                await self.runs.hand_back_unstarted()
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not await slots.changed.wait(left):
                break
        # A claim still in flight ends within its block: wait, or it could take the runs
        # handed back below.
        await slots.claims_settled(None, timeout=IDLE_WAIT_TIMEOUT_S + 1)
        await self.runs.hand_back_unstarted()
        leftovers = [r for r in self.slots.inflight.values() if r.stop_reason is None]
        if leftovers:
            log.warning("handing back %d unfinished runs", len(leftovers))
            for r in leftovers:
                r.stop(StopReason.SHUTDOWN)
            tasks = [r.task for r in leftovers if r.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)
            # Runs the fence answered (writing when stopped) have nothing to hand back.
            await self.runs.hand_back([r for r in leftovers if not r.answered])
        # Runs of a late claim whose reply was lost: handed back (after the leftovers, so a
        # stop while Redis is away does not delay them).
        await self.recovery.settle(timeout=min(3.0, max(0.5, s.hard_exit_s * 0.15)))
        # Runs stopped for another reason (cancel, claim loss) finish their own writes.
        others = [r.task for r in self.slots.inflight.values() if r.task and not r.task.done()]
        if others:
            await asyncio.wait(others, timeout=2.0)
        await self._farewell()
        return EXIT_REDIS_LOST if self.env.self_stopping else EXIT_OK

    async def _farewell(self) -> None:
        try:
            await self.scheduler.release()
            await self.heartbeat.beat(status="stopped")
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.workers, self.worker_id)
                pipe.delete(self.keys.worker(self.worker_id))
                await pipe.execute()
            await self.env.write_event("worker_stopped")
        except (rex.RedisError, OSError) as exc:
            log.warning("could not deregister cleanly: %s", exc)
        log.info("worker %s stopped", self.worker_id)

    async def _close(self) -> None:
        await self.consumer.close()
        self.env.cancel_background()
        self.pool.shutdown(wait=False, cancel_futures=True)
        for r in (self.redis, self.blocking):
            with contextlib.suppress(Exception):
                await r.aclose()
