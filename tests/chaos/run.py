"""The chaos soak: ``python -m tests.chaos.run --minutes N [--seed S] [--out build/chaos]``.

Starts a redis-server with AOF, a TCP proxy in front of it, and several ``dtq-worker``
subprocesses that reach Redis only through the proxy. Tasks of mixed length are enqueued while a
seeded fault driver repeatedly SIGKILLs a worker (a supervisor starts a new one), SIGSTOPs one past
the visibility timeout and resumes it, restarts Redis, cuts and restores the proxy's links, and
loses one reply after Redis ran the command (a claim, the idle XREAD's claim, or an outcome write
with its refill claim: the proxy aborts the link instead of answering). A share of the work is
enqueued as chords (``--chord-share``, ``--chord-members``): their members and callbacks are
checked like every task, and each chord's join on top (tests/chaos/check.py, check_chords).
After the faults stop, it waits for every task to end and checks the journals (tests/chaos/app.py)
against Redis. Writes ``report.md`` and ``report.json``; exits 0 when every check passes.

``--cluster``: the same soak on a Redis Cluster (3 masters, one replica each; no proxy), with
cluster faults among the worker faults, each on the queue's slot: the slot migrated to another
master, batch by batch, under load (``migrate``); a coordinated failover, ``CLUSTER FAILOVER``
sent to the replica of the slot's master (``failover``); that replica SIGKILLed and started
again, a full resync (``replica``). ``--faults`` picks the kinds; ``masterkill`` (the slot's
master SIGKILLed, its replica promoted, the old master rejoining as a replica) is offered but
not in the default set: with asynchronous replication it may lose acknowledged writes, which
the checks then report (docs/operations.md, "What a failover can lose").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from dtq import Client, chord, group, sig
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.settings import Settings
from dtq.store.keys import Keys, split_task_id
from tests.chaos import groups as grp
from tests.chaos.check import (
    Fault,
    WorkerLife,
    analyze,
    build_runs,
    check_chords,
    frozen_spans,
    markdown,
    read_journals,
)
from tests.chaos.proxy import Proxy
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "chaos"
KINDS = ("kill", "stop", "redis", "cut", "lostreply")
CLUSTER_KINDS = ("kill", "stop", "migrate", "failover", "replica")
# Offered with --faults, not by default: may lose acknowledged writes (see the docstring).
CLUSTER_EXTRA_KINDS = ("masterkill",)
# Which reply the lostreply fault loses: a script call whose bytes hold the script's sha.
LOST_REPLY_TARGETS = ("claim", "claim+xread", "complete")


@dataclass
class Config:
    seconds: float = 60.0
    seed: int = 1
    workers: int = 4
    concurrency: int = 8
    prefetch: int = 0  # DTQ_WORKER_PREFETCH: runs each worker claims ahead of free slots
    heartbeat_s: float = 0.5
    visibility_s: float = 3.0
    rate: float = 40.0  # tasks enqueued per second of the fault window
    fault_gap_s: tuple[float, float] = (2.0, 4.0)
    settle_s: float = 90.0
    slack_s: float = 0.5  # scheduling slack on the one-heartbeat cancel bound (busy 2-core box)
    cluster: bool = False  # on a Redis Cluster, with cluster faults (CLUSTER_KINDS)
    chord_share: float = 0.0  # share of the enqueue batches sent as one chord instead (CLI: 0.2)
    chord_members: int = 50  # members per chord (one enqueue batch's tasks)
    faults: tuple[str, ...] = ()  # the fault kinds (default: KINDS, or CLUSTER_KINDS)
    # Fair groups (tests/chaos/groups.py): the share of tasks with a group (CLI: 0.5), among
    # how many groups, the heavy ones first; the workers' cap per group (0: none); holds.
    group_share: float = 0.0
    groups: int = 16
    heavy_groups: int = 3
    group_cap: int = 0
    group_holds: bool = False


class Soak:
    def __init__(self, cfg: Config, out: Path) -> None:
        self.cfg = cfg
        self.out = out
        self.rng = random.Random(cfg.seed)
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.lives: dict[str, WorkerLife] = {}
        self.faults: list[Fault] = []
        self.ids: dict[int, str] = {}
        self.chords: list[dict[str, Any]] = []  # flow, callback, cb_idx, members (idx in order)
        self.gplan = grp.GroupPlan(cfg.group_share, cfg.groups, cfg.heavy_groups, cfg.seed)
        self.holds: grp.HoldDriver | None = None
        self.canceller: grp.Canceller | None = None
        self.n_spawned = 0
        self.stop_supervisor = threading.Event()
        self.paused: set[str] = set()

    # --- processes -----------------------------------------------------------------------------

    def spawn(self) -> None:
        with self.lock:
            self.n_spawned += 1
            wid = f"w{self.n_spawned:03d}"
        env = dict(os.environ)
        env.update(
            {
                "DTQ_REDIS_URL": self.worker_url,
                "DTQ_KEY_PREFIX": PREFIX,
                "DTQ_WORKER_ID": wid,
                "DTQ_HEARTBEAT_INTERVAL_S": str(self.cfg.heartbeat_s),
                "DTQ_VISIBILITY_TIMEOUT_S": str(self.cfg.visibility_s),
                "DTQ_DRAIN_TIMEOUT_S": "2",
                "DTQ_WORKER_PREFETCH": str(self.cfg.prefetch),
                "DTQ_HARD_EXIT_S": "5",
                "DTQ_RETRY_BACKOFF_S": "0.1",
                "DTQ_RETRY_BACKOFF_MAX_S": "1",
                "DTQ_CHAOS_DIR": str(self.journal_dir),
                "PYTHONPATH": str(ROOT),
            }
        )
        env.pop("DTQ_GROUP_CONCURRENCY", None)
        if self.cfg.group_cap:
            env["DTQ_GROUP_CONCURRENCY"] = f"default={self.cfg.group_cap}"
        log = (self.out / "logs" / f"{wid}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dtq_worker", "tests.chaos.app:app",
             "--concurrency", str(self.cfg.concurrency)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        with self.lock:
            self.procs[wid] = proc
            self.lives[wid] = WorkerLife(wid, proc.pid, time.time())

    def supervise(self) -> None:
        """Notice exits (self-stop, kills) and keep the worker count up."""
        while not self.stop_supervisor.is_set():
            with self.lock:
                dead = [(w, p) for w, p in self.procs.items() if p.poll() is not None]
                for wid, p in dead:
                    del self.procs[wid]
                    life = self.lives[wid]
                    life.ended, life.code = time.time(), p.returncode
            for _ in dead:
                self.spawn()
            time.sleep(0.1)

    def live_workers(self) -> list[str]:
        with self.lock:
            return [w for w, p in self.procs.items() if p.poll() is None and w not in self.paused]

    # --- enqueueing ------------------------------------------------------------------------------

    def enqueue_all(self, until: float) -> None:
        total = int(self.cfg.seconds * self.cfg.rate)
        rng = random.Random(self.cfg.seed * 7919)
        settings = Settings(redis_url=self.redis.url, key_prefix=PREFIX)
        client = Client(settings=settings)
        batch, start = max(1, self.cfg.chord_members), time.time()
        for first in range(0, total, batch):
            # (no draw without chords: the plain workload of a seed stays what it was)
            if self.cfg.chord_share > 0 and rng.random() < self.cfg.chord_share:
                self.enqueue_chord(client, settings, rng, range(first, min(total, first + batch)))
                due = start + (first + batch) / total * (until - start)
                time.sleep(max(0.0, due - time.time()))
                continue
            items = []
            for idx in range(first, min(total, first + batch)):
                roll = rng.random()
                # Mostly short; a few outlast a SIGSTOP, so the frozen worker finds on resume
                # that it lost their claims and must cancel them.
                ms = (
                    rng.randint(5, 50) if roll < 0.7
                    else rng.randint(100, 500) if roll < 0.92
                    else rng.randint(1000, 3000) if roll < 0.97
                    else rng.randint(6000, 10000)
                )  # fmt: skip
                sync = rng.random() < 0.15 and ms <= 500
                item: dict[str, Any] = {
                    "name": "chaos.sync" if sync else "chaos.async",
                    "kwargs": {"idx": idx, "ms": ms},
                    "priority": rng.randint(0, 9),
                    "max_retries": 50,
                    # Retried batches after a Redis restart must not enqueue twice.
                    "idempotency_key": f"chaos-{self.cfg.seed}-{idx}",
                }
                opts, kw = self.gplan.options(idx)
                item["kwargs"] |= kw
                items.append(item | opts)
            while True:
                try:
                    handles = client.enqueue_many(items)
                    break
                except Exception:  # Redis restarting: retry the same (idempotent) batch
                    time.sleep(0.2)
            for item, h in zip(items, handles, strict=True):
                self.ids[idx := item["kwargs"]["idx"]] = h.id
                if idx in self.gplan.cancel_after and self.canceller is not None:
                    self.canceller.add(time.time() + self.gplan.cancel_after[idx], h.id)
            # Spread the work over the fault window.
            due = start + (first + batch) / total * (until - start)
            time.sleep(max(0.0, due - time.time()))
        client.close()

    def enqueue_chord(
        self, client: Client, settings: Settings, rng: random.Random, idxs: range
    ) -> None:
        """One chord: a member per idx (chaos.async, short or medium), then chaos.join with a
        callback idx of its own (past the plain tasks' range). Planned once: a re-send of the
        same call after a Redis restart finds the flow made and writes nothing again."""
        cb_idx = 1_000_000 + len(self.chords)
        members = [
            sig("chaos.async", [], {"idx": i, "ms": rng.randint(5, 300)}, max_retries=50,
                priority=rng.randint(0, 9), **self.gplan.options(i, fates=False)[0])
            for i in idxs
        ]  # fmt: skip
        callback = sig("chaos.join", [], {"idx": cb_idx}, max_retries=50,
                       **self.gplan.options(cb_idx, fates=False)[0])  # fmt: skip
        flow = chord(group(*members), callback)
        p = wf.plan(flow, settings)
        call, away = wf.enqueue_call(Keys(PREFIX), p, settings.events_maxlen)
        assert not away  # every step on the home queue
        run = sc.SyncScripts(client.redis).run
        while True:
            try:
                run(call)
                break
            except Exception:  # Redis restarting: the same call again (idempotent by ftid)
                time.sleep(0.2)
        ids = [f"{s.queue}:{s.task.tid}" for s in p.steps]
        for i, sid in zip(idxs, ids, strict=False):
            self.ids[i] = sid
        self.ids[cb_idx] = ids[-1]
        self.chords.append(
            {
                "flow": p.id,
                "callback": ids[-1],
                "cb_idx": cb_idx,
                "members": list(idxs),
                "member_ids": ids[:-1],
            }
        )

    # --- faults --------------------------------------------------------------------------------

    def fault(self, kind: str) -> None:
        rng, cfg = self.rng, self.cfg
        t0 = time.time()
        victim = ""
        if kind in ("kill", "stop"):
            live = self.live_workers()
            if not live:
                return
            victim = rng.choice(sorted(live))
            with self.lock:
                proc = self.procs.get(victim)
            if proc is None:
                return
            if kind == "kill":
                with self.lock:
                    self.lives[victim].killed_at = time.time()
                os.kill(proc.pid, signal.SIGKILL)
                t0 = self.lives[victim].killed_at or t0
                self.faults.append(Fault("kill", t0, t0, victim))
                return
            with self.lock:
                self.paused.add(victim)
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(cfg.visibility_s + rng.uniform(1.0, 2.5))
            os.kill(proc.pid, signal.SIGCONT)
            with self.lock:
                self.paused.discard(victim)
        elif kind == "migrate":
            assert isinstance(self.redis, RedisClusterFixture)
            move = self.redis.begin_move(Keys(PREFIX).queue("default").streams[0])
            victim = f"{move.src.port}->{move.dst.port}"
            move.finish(batch=10, pause_s=0.01)
        elif kind in ("failover", "replica", "masterkill"):
            assert isinstance(self.redis, RedisClusterFixture)
            key = Keys(PREFIX).queue("default").streams[0]
            if kind == "failover":
                old, new = self.redis.failover(key)
                victim = f"{old.port}->{new.port}"
            elif kind == "replica":
                victim = str(self.redis.restart_replica(key, rng.uniform(0.2, 1.0)).port)
            else:
                # The fault ends with the promotion; the old master then rejoins (a replica).
                dead = self.redis.kill_master_of(key)
                victim = f"{dead.port}->{self.redis.master_of(key).port}"
                self.faults.append(Fault(kind, t0, time.time(), victim))
                self.redis.rejoin(dead)
                return
        elif kind == "redis":
            assert isinstance(self.redis, RedisServer)
            self.redis.stop()
            time.sleep(rng.uniform(0.2, 1.0))
            self.redis.start()
        elif kind == "cut":
            assert self.proxy is not None
            self.proxy.cut()
            time.sleep(rng.uniform(0.3, 3.0))
            self.proxy.restore()
        elif kind == "lostreply":
            first = rng.randrange(len(LOST_REPLY_TARGETS))
            # The chosen kind of call, else the next (a busy fleet sends few idle pairs).
            for k in range(len(LOST_REPLY_TARGETS)):
                target = LOST_REPLY_TARGETS[(first + k) % len(LOST_REPLY_TARGETS)]
                lost = self.lose_replies(target, rng.uniform(1.0, 2.0))
                if lost:
                    self.faults.append(Fault(kind, t0, time.time(), victim, f"{target} x{lost}"))
                    return
                print(f"[chaos] lostreply {target}: no such call went out", flush=True)
            return
        self.faults.append(Fault(kind, t0, time.time(), victim))

    def lose_replies(self, target: str, seconds: float) -> int:
        """Lose the reply of every call of ``target`` for ``seconds`` (one at a time: each
        lost reply aborts its link); returns how many were lost."""
        script, _, with_xread = target.partition("+")
        sha = hashlib.sha1(sc.source(script).encode()).hexdigest().encode()
        end, lost = time.time() + seconds, 0
        assert self.proxy is not None
        while (left := end - time.time()) > 0:
            rule = self.proxy.drop_reply_when(
                lambda d: sha in d and (b"XREAD" in d) == bool(with_xread)
            )
            if rule.fired.wait(left):
                lost += 1
            else:
                self.proxy.clear_rule(rule)
        return lost

    # --- the soak ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        wall0 = time.time()
        if self.out.exists():
            shutil.rmtree(self.out)
        self.journal_dir = self.out / "journals"
        self.journal_dir.mkdir(parents=True)
        (self.out / "logs").mkdir()
        self.redis: RedisServer | RedisClusterFixture
        self.proxy: Proxy | None = None
        if cfg.cluster:
            self.redis = RedisClusterFixture().start()
            self.worker_url = self.redis.url
        else:
            self.redis = RedisServer(aof=True).start()
            proxy_port = free_port()
            self.proxy = Proxy(proxy_port, self.redis.port).start()
            self.worker_url = f"redis://127.0.0.1:{proxy_port}/0"
        kinds = cfg.faults or (CLUSTER_KINDS if cfg.cluster else KINDS)
        sup = threading.Thread(target=self.supervise, daemon=True)
        try:
            for _ in range(cfg.workers):
                self.spawn()
            sup.start()
            time.sleep(1.0)
            until = time.time() + cfg.seconds
            feeder = threading.Thread(target=self.enqueue_all, args=(until,), daemon=True)
            settings = Settings(redis_url=self.redis.url, key_prefix=PREFIX)
            if cfg.group_share > 0:
                self.canceller = grp.Canceller(Client(settings=settings))
                self.canceller.start()
            feeder.start()
            if cfg.group_holds and cfg.group_share > 0:
                client = Client(settings=settings)
                self.holds = grp.HoldDriver(
                    client, "default", self.gplan.names, cfg.seed * 31 + 7, until
                )
                self.holds.start()
            bag: list[str] = []
            while time.time() < until:
                time.sleep(self.rng.uniform(*cfg.fault_gap_s))
                if time.time() >= until:
                    break
                if not bag:
                    bag = list(kinds)
                    self.rng.shuffle(bag)
                kind = bag.pop()
                print(f"[chaos] {time.time() - wall0:6.1f}s fault {kind}", flush=True)
                self.fault(kind)
            feeder.join()
            if self.holds is not None:
                self.holds.join()
            if self.canceller is not None:
                self.canceller.done.set()
                self.canceller.join()
            print(f"[chaos] faults over; {len(self.ids)} tasks; settling", flush=True)
            self.settle()
        finally:
            self.stop_supervisor.set()
            sup.join(5) if sup.is_alive() else None
            self.stop_workers()
            records, stats = self.collect()
            if self.proxy is not None:
                self.proxy.stop()
            self.redis.cleanup()
        report = self.report(records, stats, time.time() - wall0)
        return report

    def settle(self) -> None:
        deadline = time.time() + self.cfg.settle_s
        r = self.redis.client()
        while time.time() < deadline:
            if not self.unfinished(r):
                return
            time.sleep(1.0)

    def unfinished(self, r: redis.Redis) -> int:
        keys = Keys(PREFIX)
        pipe = r.pipeline(transaction=False)
        for tid in self.ids.values():
            q, t = split_task_id(tid)
            pipe.hget(keys.queue(q).task(t), "status")
        try:
            statuses = pipe.execute()
        except redis.RedisError:
            return len(self.ids)
        return sum(1 for s in statuses if s not in ("succeeded", "failed", "cancelled", "expired"))

    def stop_workers(self) -> None:
        with self.lock:
            procs = dict(self.procs)
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for wid, p in procs.items():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            life = self.lives[wid]
            life.ended, life.code = time.time(), p.returncode

    def collect(self) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
        r = self.redis.client()
        keys = Keys(PREFIX)
        pipe = r.pipeline(transaction=False)
        order = list(self.ids.values())
        for tid in order:
            q, t = split_task_id(tid)
            pipe.hgetall(keys.queue(q).task(t))
        records = dict(zip(order, pipe.execute(), strict=True))
        for c in self.chords:  # the flows' own state (status, result)
            home, ftid = split_task_id(c["flow"])
            records[c["flow"]] = r.hgetall(keys.queue(home).flow(ftid))
        (self.out / "records.json").write_text(json.dumps(records))
        self.leftover = grp.leftover_group_keys(r, keys.queue("default"))
        raw = r.hgetall(keys.queue("default").stats)
        stats = {k: int(v) for k, v in raw.items() if str(v).lstrip("-").isdigit()}
        return records, stats

    def report(
        self, records: dict[str, dict[str, str]], stats: dict[str, int], wall: float
    ) -> dict[str, Any]:
        logs = [p.read_text(errors="replace") for p in (self.out / "logs").glob("*.log")]
        claims_lost = sum(t.count("claim lost: ") for t in logs)
        stale_logged = sum(t.count("stale outcome rejected") for t in logs)
        adopted = sum(t.count("adopted run after a lost reply") for t in logs)
        journal = read_journals(self.journal_dir)
        result = analyze(
            ids=self.ids,
            records=records,
            journal=journal,
            faults=self.faults,
            workers=list(self.lives.values()),
            heartbeat_s=self.cfg.heartbeat_s,
            visibility_s=self.cfg.visibility_s,
            slack_s=self.cfg.slack_s,
            stats=stats,
            claims_lost_logged=claims_lost,
            stale_rejected_logged=stale_logged,
            adopted_logged=adopted,
        )
        chords = check_chords(self.chords, records, journal)
        parts = {"chords": chords}
        if self.cfg.group_share > 0:
            parts["groups"] = grp.check_groups(
                ids=self.ids,
                plan=self.gplan,
                heavy=self.gplan.names[: self.cfg.heavy_groups],
                records=records,
                runs_by_task=build_runs(journal, list(self.lives.values())),
                frozen=frozen_spans(self.faults),
                holds=self.holds.holds if self.holds is not None else [],
                leftover=self.leftover,
                cap=self.cfg.group_cap,
                heartbeat_s=self.cfg.heartbeat_s,
                slack_s=self.cfg.slack_s,
            )
        for name, part in parts.items():
            result["checks"] += part["checks"]
            result["ok"] = result["ok"] and all(c["ok"] for c in part["checks"])
            result["figures"] |= part["figures"]
            result["problems"][name] = part["problems"]
        cfg = asdict(self.cfg)
        report = {"config": cfg, "wall_s": round(wall, 1), **result}
        report["faults"] = [asdict(f) for f in self.faults]
        report["workers"] = [asdict(w) for w in self.lives.values()]
        (self.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        (self.out / "report.md").write_text(markdown(report))
        return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    p.add_argument("--minutes", type=float, default=1.0, help="length of the fault window")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=0, help="DTQ_WORKER_PREFETCH of each worker")
    p.add_argument("--out", default=str(ROOT / "build" / "chaos"))
    p.add_argument("--cluster", action="store_true", help="on a Redis Cluster, cluster faults")
    p.add_argument(
        "--chord-share",
        type=float,
        default=0.2,
        help="share of the work enqueued as chords (default 0.2)",
    )
    p.add_argument("--chord-members", type=int, default=50, help="members per chord")
    p.add_argument(
        "--group-share", type=float, default=0.5, help="share of the tasks with a fair group"
    )
    p.add_argument("--groups", type=int, default=16, help="how many groups")
    p.add_argument(
        "--heavy-groups", type=int, default=3, help="groups that get half the grouped tasks"
    )
    p.add_argument(
        "--group-cap", type=int, default=0, help="DTQ_GROUP_CONCURRENCY of the workers (0: none)"
    )
    p.add_argument(
        "--group-holds", action="store_true", help="pause and resume random groups meanwhile"
    )
    p.add_argument(
        "--faults",
        default="",
        help=f"comma-separated fault kinds (default {','.join(KINDS)}; with --cluster "
        f"{','.join(CLUSTER_KINDS)}, and {','.join(CLUSTER_EXTRA_KINDS)} on request)",
    )
    args = p.parse_args(argv)
    faults = tuple(k for k in args.faults.split(",") if k)
    allowed = (CLUSTER_KINDS + CLUSTER_EXTRA_KINDS) if args.cluster else KINDS
    if bad := [k for k in faults if k not in allowed]:
        p.error(f"unknown fault kind(s) {bad}; allowed here: {', '.join(allowed)}")
    cfg = Config(
        seconds=args.minutes * 60,
        seed=args.seed,
        workers=args.workers,
        prefetch=args.prefetch,
        cluster=args.cluster,
        chord_share=args.chord_share,
        chord_members=args.chord_members,
        faults=faults,
        group_share=args.group_share,
        groups=args.groups,
        heavy_groups=args.heavy_groups,
        group_cap=args.group_cap,
        group_holds=args.group_holds,
    )
    report = Soak(cfg, Path(args.out)).run()
    print((Path(args.out) / "report.md").read_text())
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
