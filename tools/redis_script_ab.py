"""Redis time per task of the hot-path scripts of two or more checkouts, compared in short turns
(docs/performance.md, "Profiling"). On a shared machine the CPU time of one run moves by
10-20% with the neighbours' load; here every checkout gets its own redis-server and its own
process sending its own scripts, and they take turns in blocks of a few hundred tasks (in a
random order each turn), so all of them meet the same bursts of load and the ratios hold
better; ``--cpu`` also pins every server to one CPU. Even so a ratio moves by a few percent from
one run to the next: take the median of several.

    .venv/bin/python -m tools.redis_script_ab /work/wt/base /work/wt/lua \\
        [--n 20000] [--block 320] [--cpu 1]

Each checkout is named by its root (its ``libs`` goes first on the process's path, so its
``dtq.scripts`` builds the calls and its ``lua/`` is what Redis runs). Phases, as in
tools/redis_instructions.py: bulk enqueue (parts of 500 plain tasks) and the worker's cycle
(complete.lua storing 32 outcomes and claiming 32 runs). Per phase and checkout it prints the
EVALSHA time (``INFO commandstats``) and the server's CPU (``INFO cpu``) per task, read around
each block, and each figure's ratio to the first checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
CHILD = """\
import json, sys
import redis
from dtq import scripts as sc
from dtq.store.keys import GROUP, Keys
from tools.redis_instructions import BATCH, EM, TTL, _runs, _task

r = redis.Redis(port=int(sys.argv[1]))
qk = Keys("ab").queue("default")
for s in qk.streams:
    r.xgroup_create(s, GROUP, id="0", mkstream=True)
run = sc.SyncScripts(r).run
run(sc.enqueue_call(qk, [_task()], EM))  # loads the scripts outside the measure
runs = _runs(run(sc.claim_call(qk, "w1", 1, EM, TTL)))
acc = {"bulk": [0, 0, 0.0], "cycle": [0, 0, 0.0]}  # tasks, EVALSHA usec, CPU s


def counters():
    i = r.info("commandstats").get("cmdstat_evalsha", {})
    c = r.info("cpu")
    return int(i.get("usec", 0)), float(c["used_cpu_sys"]) + float(c["used_cpu_user"])


def bulk(k):
    for i in range(0, k, 500):
        run(sc.enqueue_call(qk, [_task() for _ in range(min(500, k - i))], EM))
    return k


def cycle(k):
    global runs
    count = 0
    while runs and count < k:
        count += len(runs)
        outs = [sc.Success(t, e, a, "succeeded", "null") for t, e, a in runs]
        raw = run(sc.complete_call(qk, "w1", outs, EM, TTL, claim=BATCH))
        runs = _runs(raw[-1]) if raw and isinstance(raw[-1], list) else []
    return count


print("ready", flush=True)
for line in sys.stdin:
    phase, k = line.split()
    if phase == "stats":
        print(json.dumps(acc), flush=True)
        continue
    if phase == "cycle" and not runs:
        runs = _runs(run(sc.claim_call(qk, "w1", BATCH, EM, TTL)))
    u0, c0 = counters()
    done = (bulk if phase == "bulk" else cycle)(int(k))
    u1, c1 = counters()
    a = acc[phase]
    a[0] += done; a[1] += u1 - u0; a[2] += c1 - c0
    print(done, flush=True)
"""


class Side:
    """One checkout: its redis-server and the process that sends its scripts."""

    def __init__(self, root: str, cpu: int | None) -> None:
        self.root = root
        self.server = RedisServer().start()
        if cpu is not None and self.server.proc is not None:
            os.sched_setaffinity(self.server.proc.pid, {cpu})
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([f"{root}/libs", str(ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(self.server.port)], env=env, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if self.ask("") != "ready":
            raise RuntimeError(f"{root}: the script process did not start")

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.server.stop()


def turns(sides: list[Side], phase: str, n: int, block: int) -> None:
    """``n`` tasks of ``phase`` on every side, in blocks, the sides in a new order each turn."""
    left = {s.root: n for s in sides}
    while any(v > 0 for v in left.values()):
        for s in random.sample(sides, len(sides)):
            if left[s.root] > 0:
                done = int(s.ask(f"{phase} {min(block, left[s.root])}"))
                left[s.root] = left[s.root] - done if done else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", help="checkout roots; ratios are to the first")
    ap.add_argument("--n", type=int, default=20_000, help="tasks per phase and checkout")
    ap.add_argument("--block", type=int, default=320, help="tasks per turn")
    ap.add_argument("--cpu", type=int, help="pin every redis-server to this CPU")
    a = ap.parse_args()
    sides: list[Side] = []
    try:
        for root in a.roots:
            sides.append(Side(root, a.cpu))
        turns(sides, "bulk", a.n, a.block)
        turns(sides, "cycle", a.n, a.block)
        stats: dict[str, Any] = {s.root: json.loads(s.ask("stats x")) for s in sides}
    finally:
        for s in sides:
            s.close()
    first = stats[a.roots[0]]
    for phase in ("bulk", "cycle"):
        print(f"{phase}: EVALSHA us/task, Redis CPU us/task (ratio to {a.roots[0]})")
        for root, st in stats.items():
            tasks, usec, cpu = st[phase]
            t0, u0, c0 = first[phase]
            ev, cp = usec / tasks, cpu * 1e6 / tasks
            ev_r, cp_r = ev / (u0 / t0), cp / (c0 * 1e6 / t0)
            print(f"  {root:<24} {ev:7.2f} ({ev_r:.3f})  {cp:7.2f} ({cp_r:.3f})")
    print("enqueued (bulk) and completed: Redis CPU us/task")
    for root, st in stats.items():
        total = sum(st[p][2] * 1e6 / st[p][0] for p in ("bulk", "cycle"))
        base = sum(first[p][2] * 1e6 / first[p][0] for p in ("bulk", "cycle"))
        print(f"  {root:<24} {total:7.2f} ({total / base:.3f})")


if __name__ == "__main__":
    main()
