"""Workload W: the Redis-side cost of a workflow step against a plain task (docs/workflows.md).

Each task's whole life is run by hand on the bench's redis-server (enqueue, claim, complete;
no worker, events off), reading ``INFO commandstats`` (usec of EVALSHA: Redis time, not the
client's) and ``INFO memory``:

* plain tasks, claimed and completed 1 and 16 at a time;
* a chain of N steps (each step's completion releases the next), 1 at a time;
* a chord of N members (completed 16 at a time) and its callback;
* memory per waiting task: N plain tasks enqueued, a group of N enqueued (with the share of
  the flow's state hash).

A chain step is compared with a plain task at batch 1, a chord member with one at batch 16
(the way each is claimed). Alone: ``dtq bench --peers none --workloads W``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.sdk.requests import TaskDefaults, build_task
from dtq.settings import Settings
from dtq.store.keys import GROUP, Keys, QueueKeys

Enqueue = Callable[[QueueKeys], None]
PREFIX = "fc"


def _groups(r: redis.Redis, qk: QueueKeys) -> None:
    for stream in qk.streams:
        r.xgroup_create(stream, GROUP, id="0", mkstream=True)


def _usec(r: redis.Redis) -> float:
    stats: Any = r.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _run_all(run: Any, qk: QueueKeys, batch: int) -> int:
    """Claim and complete until the queue is dry; returns the runs done."""
    done = 0
    while True:
        runs = sc.parse_claim(qk.queue, run(sc.claim_call(qk, "w", batch, 0, 60))).runs
        if not runs:
            return done
        outs = [sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1") for c in runs]
        run(sc.complete_call(qk, "w", outs, 0, 60))
        done += len(runs)


def measure(r: redis.Redis, st: Settings, enqueue: Enqueue, batch: int) -> tuple[float, float, int]:
    """(enqueue usec, claim+complete usec, runs) of one scenario on a fresh queue."""
    qk = Keys(st.key_prefix).queue(f"q{r.incr(PREFIX + ':n')}")
    _groups(r, qk)
    run = sc.SyncScripts(r).run
    warm = build_task(st, "t", [1], defaults=TaskDefaults(queue=qk.queue))[1]
    run(sc.enqueue_call(qk, [warm], 0))  # loads the scripts outside the measure
    _run_all(run, qk, 1)
    r.config_resetstat()
    enqueue(qk)
    enq = _usec(r)
    r.config_resetstat()
    n = _run_all(run, qk, batch)
    return enq, _usec(r), n


class Scenarios:
    """The enqueue side of each scenario, for ``n`` tasks on a Redis reached by ``r``."""

    def __init__(self, r: redis.Redis, n: int) -> None:
        self.r, self.n = r, n
        self.st = Settings(redis_url="redis://unused", key_prefix=PREFIX, events_maxlen=0)
        self.keys = Keys(PREFIX)
        self.run = sc.SyncScripts(r).run

    def plain(self, qk: QueueKeys) -> None:
        d = TaskDefaults(queue=qk.queue)
        tasks = [build_task(self.st, "t", [1], defaults=d)[1] for _ in range(self.n)]
        for i in range(0, self.n, 250):
            self.run(sc.enqueue_call(qk, tasks[i : i + 250], 0))

    def _flow(self, flow: wf.Flow) -> None:
        p = wf.plan(flow, self.st)
        call, _ = wf.enqueue_call(self.keys, p, 0)
        self.run(call)

    def chain(self, qk: QueueKeys) -> None:
        self._flow(wf.chain(*(wf.sig("t", [1], queue=qk.queue) for _ in range(self.n))))

    def chord(self, qk: QueueKeys) -> None:
        members = (wf.sig("t", [1], queue=qk.queue) for _ in range(self.n))
        self._flow(wf.chord(wf.group(*members), wf.sig("t", queue=qk.queue)))

    def per_task(self, enqueue: Enqueue, batch: int) -> tuple[float, float]:
        """(enqueue, claim+complete) Redis usec per task of one scenario."""
        enq, done, runs = measure(self.r, self.st, enqueue, batch)
        return enq / runs, done / runs

    def key_bytes(self) -> int:
        """The bytes of every key now in Redis (``MEMORY USAGE``, exact: ``SAMPLES 0``), summed.
        Unlike ``used_memory``, unmoved by what Redis allocates or frees beside the keys
        meanwhile (a client's buffers): with a small N that noise outweighed the tasks."""
        keys = list(self.r.scan_iter(count=1000))
        return sum(int(self.r.memory_usage(k, samples=0) or 0) for k in keys)

    def memory(self) -> dict[str, float]:
        """Bytes per waiting plain task, per chord member, and its share of the flow hash."""
        out: dict[str, float] = {}
        for name, enqueue in (("plain_task_bytes", self.plain), ("chord_member_bytes", self.chord)):
            self.r.flushall()
            qk = self.keys.queue("mem")
            _groups(self.r, qk)
            base = self.key_bytes()
            enqueue(qk)
            out[name] = round((self.key_bytes() - base) / self.n, 1)
        fk: Any = self.r.keys(f"{PREFIX}:*:f:*")[0]
        flow_bytes = int(self.r.memory_usage(fk, samples=0) or 0)
        out["flow_state_bytes_per_member"] = round(flow_bytes / self.n, 1)
        self.r.flushall()
        return out


def flow_cost(url: str, n: int) -> dict[str, Any]:
    """One repetition of workload W on the (empty, private) Redis at ``url``."""
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        s = Scenarios(r, n)
        res: dict[str, Any] = {"n": n, "setting": "Redis EVALSHA usec per task, by hand"}
        for key, enqueue, batch in (
            ("plain_b1", s.plain, 1),
            ("plain_b16", s.plain, 16),
            ("chain_step", s.chain, 1),
            ("chord_member", s.chord, 16),
        ):
            enq, done = s.per_task(enqueue, batch)
            res[f"{key}_enqueue_us"] = round(enq, 2)
            res[f"{key}_run_us"] = round(done, 2)
            res[f"{key}_us"] = round(enq + done, 2)
        res["chain_step_extra_us"] = round(res["chain_step_us"] - res["plain_b1_us"], 2)
        res["chord_member_extra_us"] = round(res["chord_member_us"] - res["plain_b16_us"], 2)
        res |= s.memory()
        return res
    finally:
        r.close()


# (key, label) of the rows of results.md's W section.
ROWS = [
    ("plain_b1", "plain task, claimed and completed 1 at a time"),
    ("chain_step", "chain step (its completion releases the next), 1 at a time"),
    ("plain_b16", "plain task, 16 at a time"),
    ("chord_member", "chord member (+ its share of the callback), 16 at a time"),
]


def markdown(rec: dict[str, Any], fmt: Callable[[Any], str]) -> list[str]:
    """The W section of results.md from the median record."""
    lines = [
        "## W: workflow cost (dtq)",
        "",
        f"Redis time (EVALSHA usec) per task, whole life by hand (enqueue, claim, complete; "
        f"events off), N={fmt(rec.get('n'))}. A chain step compares with a plain task at batch "
        "1, a chord member with one at batch 16.",
        "",
        "| scenario | enqueue | claim + complete | total |",
        "|---|---:|---:|---:|",
    ]
    for key, label in ROWS:
        lines.append(
            f"| {label} | {fmt(rec.get(key + '_enqueue_us'))} | {fmt(rec.get(key + '_run_us'))} "
            f"| {fmt(rec.get(key + '_us'))} |"
        )
    lines += [
        "",
        f"Extra per chain step: {fmt(rec.get('chain_step_extra_us'))} us; per chord member: "
        f"{fmt(rec.get('chord_member_extra_us'))} us. Memory per waiting task: plain "
        f"{fmt(rec.get('plain_task_bytes'))} B, chord member {fmt(rec.get('chord_member_bytes'))}"
        f" B (of which the flow's state hash {fmt(rec.get('flow_state_bytes_per_member'))} B).",
        "",
    ]
    return lines
