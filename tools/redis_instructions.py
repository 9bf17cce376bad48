"""Redis instructions per task of the hot-path scripts, counted exactly (docs/performance.md,
"Redis instructions per task"): a redis-server under valgrind's callgrind, the counters zeroed
and dumped around each phase. Unlike CPU time, the count does not move with the machine's load,
so two versions of the code compare on a busy host. Needs valgrind; takes about a minute.

    .venv/bin/python -m tools.redis_instructions [N] [--keep] [--by-name] [--batch K]
    PYTHONPATH=<other checkout>/libs .venv/bin/python -m tools.redis_instructions  # another version

``--by-name`` enqueues the tasks as a client that does not import the task does (its max_retries,
timeout and expiry left to the worker's declaration, which is published first): the path of
``make bench``'s workloads, whose client enqueues ``"noop"`` by name.

The history (dtq.stats) is written as at the default retention where the version has it;
``--no-hist`` leaves it out (as ``DTQ_STATS_RETENTION_H=0``).

``--batch K``: the cycle's outcomes and claims per call (default 32; ``make bench``'s worker
sends 16 at its concurrency 32).

``--keep`` leaves the callgrind dumps and prints their folder: ``callgrind_annotate
--inclusive=yes <the dump whose "Trigger" names the phase>`` then shows where a phase's
instructions go, command by command (hmgetCommand, xdelCommand, ...) and in the Lua glue
(parseReply: a command's reply made into Lua values; lua_pushlstring).

Phases: bulk enqueue (parts of 500 plain tasks), single enqueue, and the worker's cycle
(complete.lua storing 32 outcomes and claiming 32 runs, from claim.lua's first batch on).
"""

from __future__ import annotations

import glob
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis

from dtq import declared
from dtq import scripts as sc
from dtq.sdk.requests import DEFAULT_MAX_RETRIES, TaskDefaults
from dtq.store.keys import GROUP, Keys, new_tid
from tests.redis_server import free_port

EM, TTL, BATCH = 10_000, 3600, 32
# The history (dtq.stats) as a client and worker at the default retention write it, where this
# version has it (``--no-hist``: without, as DTQ_STATS_RETENTION_H=0).
HIST = "hist_ttl_s" in inspect.signature(sc.enqueue_call).parameters


def _task(unset: str = "") -> sc.NewTask:
    """A plain no-op task; ``unset``: what its enqueue left to the declaration (by name)."""
    return sc.NewTask(
        new_tid(), "noop", "[]", "", 5, DEFAULT_MAX_RETRIES, None, 0, 0, "", "", unset=unset
    )


def _outcomes(raw: Any) -> list[Any]:
    """The successes of a claim reply's runs, as the worker sends them: with what the claim
    told of each record where this version has it (``Success.of``), else (tid, eid, attempt)
    read whatever the fields per run (older versions)."""
    if hasattr(sc.Success, "of"):
        return [sc.Success.of(c, "succeeded", "null") for c in sc.parse_claim("default", raw).runs]
    return [sc.Success(t, e, a, "succeeded", "null") for t, e, a in _runs(raw)]


def _runs(raw: Any) -> list[tuple[str, str, int]]:
    """(tid, eid, attempt) of a claim reply, whatever its fields per run (older versions)."""
    n = int(raw[3]) if len(raw) > 3 else 0
    if n <= 0:
        return []
    step = (len(raw) - 6) // n  # then held, more (no run here has headers)
    return [
        (_s(raw[4 + k * step]), _s(raw[5 + k * step]), int(raw[6 + k * step])) for k in range(n)
    ]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def main() -> None:
    argv = sys.argv[1:]
    batch = BATCH
    if "--batch" in argv:  # outcomes (and claims) per call of the cycle
        i = argv.index("--batch")
        batch = int(argv[i + 1])
        del argv[i : i + 2]
    global HIST
    HIST = HIST and "--no-hist" not in argv
    args = [a for a in argv if a not in ("--keep", "--by-name", "--no-hist")]
    keep = "--keep" in argv
    unset = declared.FIELDS if "--by-name" in argv else ""
    n = int(args[0]) if args else 2000
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian package valgrind)")
    out = tempfile.mkdtemp(prefix="dtq-callgrind-")
    port = free_port()
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         "redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--hz", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        r = redis.Redis(port=port)
        for _ in range(300):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        pid = str(proc.pid)

        def phase(name: str, work: Any) -> float:
            subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
            tasks = work()
            subprocess.run(["callgrind_control", f"--dump={name}", pid], check=True,
                           capture_output=True)  # fmt: skip
            for path in sorted(glob.glob(f"{out}/cg.{pid}.*"), key=os.path.getmtime)[::-1]:
                with open(path) as f:
                    text = f.read()
                if f"Trigger: dump {name}" in text:
                    m = re.search(r"^summary: (\d+)", text, re.M)
                    assert m is not None
                    return int(m.group(1)) / tasks
            raise RuntimeError(f"no callgrind dump for {name}")

        qk = Keys("ri").queue("default")
        for s in qk.streams:
            r.xgroup_create(s, GROUP, id="0", mkstream=True)
        run = sc.SyncScripts(r).run
        hist: dict[str, Any] = {"hist_ttl_s": 168 * 3600} if HIST else {}

        def done_hist(outs: list[Any]) -> dict[str, Any]:  # each run in the 1 ms bucket
            return {"hist": sc.History(168 * 3600, [0] * len(outs))} if HIST else {}

        if unset:  # what a worker declares for a plain task
            r.hset(qk.decl, "noop", declared.encode(TaskDefaults()))
        # Loads the scripts outside the measure.
        run(sc.enqueue_call(qk, [_task(unset), _task(unset)], EM, **hist))
        done = _outcomes(run(sc.claim_call(qk, "w0", 2, EM, TTL)))
        run(sc.complete_call(qk, "w0", done, EM, TTL, claim=1, **done_hist(done)))

        def bulk() -> int:
            for i in range(0, n, 500):
                run(sc.enqueue_call(qk, [_task(unset) for _ in range(min(500, n - i))], EM, **hist))
            return n

        def single() -> int:
            for _ in range(n // 2):
                run(sc.enqueue_call(qk, [_task(unset)], EM, **hist))
            return n // 2

        def cycle() -> int:
            outs, count = _outcomes(run(sc.claim_call(qk, "w1", batch, EM, TTL))), 0
            while outs:
                count += len(outs)
                raw = run(sc.complete_call(qk, "w1", outs, EM, TTL, claim=batch, **done_hist(outs)))
                outs = _outcomes(raw[-1]) if raw and isinstance(raw[-1], list) else []
            return count

        print(f"history: {'on' if HIST else 'off'}")
        print(f"bulk enqueue: {phase('bulk', bulk):,.0f} instructions per task")
        print(f"single enqueue: {phase('single', single):,.0f} instructions per task")
        print(f"claim + complete ({batch} per call): {phase('cycle', cycle):,.0f} per task")
    finally:
        proc.terminate()
        proc.wait(30)
        if keep:
            print(f"callgrind dumps kept in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
