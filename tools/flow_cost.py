"""Redis-side cost of a workflow step against a plain task (docs/workflows.md, "Cost").

The measurements are workload W of the bench suite (``dtq_bench.flowcost``; ``make
bench`` reports them in build/bench/results.md). This tool runs them on its own redis-server,
REPS times, and adds the same plain tasks with the Lua scripts as they were before workflows
were merged (that commit's own loader and lua/), to show what the flow branch costs a plain task.

    PYTHONPATH=bench .venv/bin/python -m tools.flow_cost [N] [REPS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

from dtq import scripts as sc
from dtq_bench.flowcost import Enqueue, Scenarios
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "451d3a5^1"  # main just before the merge of the workflows branch (h/flows)


def _old_sources() -> dict[str, str]:
    """The hot-path scripts' texts as sent before workflows were merged, built by that version's
    own loader (``git archive BEFORE libs lua``, imported in a process of its own)."""
    old = Path(tempfile.mkdtemp(prefix="dtq-main-lua-"))
    tree = subprocess.run(["git", "archive", BEFORE, "libs", "lua"], cwd=ROOT, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(old)], input=tree.stdout, check=True)
    code = "import json; from dtq import scripts as s; "
    code += "print(json.dumps({n: s.source(n) for n in s.SCRIPT_NAMES}))"
    env = {**os.environ, "PYTHONPATH": str(old / "libs")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=old, env=env, capture_output=True, text=True, check=True
    ).stdout
    texts: dict[str, str] = json.loads(out)
    return texts


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    srv = RedisServer().start()
    try:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        s = Scenarios(r, n)
        old, new_source = _old_sources(), sc.runner.source
        rows: dict[str, list[tuple[float, float]]] = {}

        def rec(name: str, enq: Enqueue, batch: int) -> None:
            rows.setdefault(name, []).append(s.per_task(enq, batch))

        for _ in range(reps):
            rec("plain task, batch 1", s.plain, 1)
            rec("plain task, batch 16", s.plain, 16)
            sc.runner.source = old.__getitem__  # type: ignore[assignment]
            rec("plain task, batch 1 (complete.lua before workflows)", s.plain, 1)
            rec("plain task, batch 16 (complete.lua before workflows)", s.plain, 16)
            sc.runner.source = new_source
            rec("chain step, batch 1", s.chain, 1)
            rec("chord member (+ callback), batch 16", s.chord, 16)
        print(f"Redis time (EVALSHA usec) per task, median of {reps}, N={n}:")
        print(f"{'scenario':<55} {'enqueue':>8} {'claim+complete':>15} {'total':>8}")
        for name, vals in rows.items():
            enq = statistics.median(v[0] for v in vals)
            run_ = statistics.median(v[1] for v in vals)
            print(f"{name:<55} {enq:8.2f} {run_:15.2f} {enq + run_:8.2f}")
        m = s.memory()
        print(f"memory per waiting task: plain {m['plain_task_bytes']:.0f} B; chord member "
              f"{m['chord_member_bytes']:.0f} B (of which the flow state hash "
              f"{m['flow_state_bytes_per_member']:.0f} B)")  # fmt: skip
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
