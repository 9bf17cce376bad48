"""Redis-side cost of a workflow step against a plain task (docs/workflows.md, "Cost").

Starts its own redis-server and runs each task's whole life by hand (enqueue, claim,
complete; no worker), reading ``INFO commandstats`` (usec of EVALSHA) and ``INFO memory``:

* plain tasks, claimed and completed 1 and 16 at a time;
* the same plain tasks with ``complete.lua`` as it was before workflows (``git show
  main:lua/...``), to show what the flow branch costs a plain task;
* a chain of N steps (each step's completion releases the next);
* a chord of N members (completed 16 at a time) and its callback;
* memory per waiting task: N plain tasks enqueued, a group of N enqueued.

    .venv/bin/python -m tools.flow_cost [N] [REPS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from dtq import chain, chord, group, sig
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.keys import GROUP, Keys, QueueKeys
from dtq.requests import TaskDefaults, build_task
from dtq.settings import Settings
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def _groups(r: redis.Redis, qk: QueueKeys) -> None:
    for stream in qk.streams:
        r.xgroup_create(stream, GROUP, id="0", mkstream=True)


def _usec(r: redis.Redis) -> float:
    stats: Any = r.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _run_all(r: redis.Redis, run: Any, qk: QueueKeys, batch: int) -> int:
    """Claim and complete until the queue is dry; returns runs done (result = args[0])."""
    done = 0
    while True:
        runs = sc.parse_claim(qk.queue, run(sc.claim_call(qk, "w", batch, 0, 60))).runs
        if not runs:
            return done
        outs = [sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1") for c in runs]
        run(sc.complete_call(qk, "w", outs, 0, 60))
        done += len(runs)


def measure(
    r: redis.Redis, st: Settings, enqueue: Callable[[QueueKeys], None], batch: int
) -> tuple[float, float, int]:
    """(enqueue usec, claim+complete usec, runs) of one scenario on a fresh queue."""
    qk = Keys(st.key_prefix).queue(f"q{r.incr('flow_cost:n')}")
    _groups(r, qk)
    run = sc.SyncScripts(r).run
    # load the scripts outside the measure
    warm = build_task(st, "t", [1], defaults=TaskDefaults(queue=qk.queue))[1]
    run(sc.enqueue_call(qk, [warm], 0))
    _run_all(r, run, qk, 1)
    r.config_resetstat()
    enqueue(qk)
    enq = _usec(r)
    r.config_resetstat()
    n = _run_all(r, run, qk, batch)
    return enq, _usec(r), n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    srv = RedisServer().start()
    try:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        st = Settings(redis_url=srv.url, key_prefix="fc", events_maxlen=0)
        keys = Keys(st.key_prefix)
        run = sc.SyncScripts(r).run

        def plain(qk: QueueKeys) -> None:
            d = TaskDefaults(queue=qk.queue)
            tasks = [build_task(st, "t", [1], defaults=d)[1] for _ in range(n)]
            for i in range(0, n, 250):
                run(sc.enqueue_call(qk, tasks[i : i + 250], 0))

        def flow(make: Callable[[str], wf.Flow]) -> Callable[[QueueKeys], None]:
            def go(qk: QueueKeys) -> None:
                p = wf.plan(make(qk.queue), st)
                call, _ = wf.enqueue_call(keys, p, 0)
                run(call)

            return go

        def a_chain(q: str) -> wf.Flow:
            return chain(*(sig("t", [1], queue=q) for _ in range(n)))

        def a_chord(q: str) -> wf.Flow:
            return chord(group(*(sig("t", [1], queue=q) for _ in range(n))), sig("t", queue=q))

        rows: dict[str, list[tuple[float, float, int]]] = {}

        def rec(name: str, enq: Callable[[QueueKeys], None], batch: int) -> None:
            rows.setdefault(name, []).append(measure(r, st, enq, batch))

        old = Path(tempfile.mkdtemp(prefix="dtq-main-lua-"))
        for f in (ROOT / "lua").glob("*.lua"):
            src = subprocess.run(
                ["git", "show", f"main:lua/{f.name}"], cwd=ROOT, capture_output=True, text=True
            )
            if src.returncode == 0:
                (old / f.name).write_text(src.stdout)
        new_dir = sc._lua_dir

        for _ in range(reps):
            rec("plain task, batch 1", plain, 1)
            rec("plain task, batch 16", plain, 16)
            sc._lua_dir = lambda: old  # type: ignore[assignment]
            sc.source.cache_clear()
            rec("plain task, batch 1 (complete.lua before workflows)", plain, 1)
            rec("plain task, batch 16 (complete.lua before workflows)", plain, 16)
            sc._lua_dir = new_dir  # type: ignore[assignment]
            sc.source.cache_clear()
            rec("chain step, batch 1", flow(a_chain), 1)
            rec("chord member (+ callback), batch 16", flow(a_chord), 16)
        print(f"Redis time (EVALSHA usec) per task, median of {reps}, N={n}:")
        print(f"{'scenario':<55} {'enqueue':>8} {'claim+complete':>15} {'total':>8}")
        for name, vals in rows.items():
            enq = statistics.median(v[0] / v[2] for v in vals)
            run_ = statistics.median(v[1] / v[2] for v in vals)
            print(f"{name:<55} {enq:8.2f} {run_:15.2f} {enq + run_:8.2f}")

        # Memory per waiting task / member.
        r.flushall()
        base = int(r.info("memory")["used_memory"])
        qk = keys.queue("mem1")
        _groups(r, qk)
        plain(qk)
        m_plain = (int(r.info("memory")["used_memory"]) - base) / n
        r.flushall()
        base = int(r.info("memory")["used_memory"])
        qk = keys.queue("mem2")
        _groups(r, qk)
        flow(a_chord)(qk)
        m_group = (int(r.info("memory")["used_memory"]) - base) / n
        fk = r.keys("fc:*:f:*")[0]
        m_state = int(r.memory_usage(fk) or 0) / n
        print(f"memory per waiting task: plain {m_plain:.0f} B; chord member {m_group:.0f} B "
              f"(of which the flow state hash {m_state:.0f} B)")  # fmt: skip
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
