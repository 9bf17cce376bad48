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

``--groups 0,1,100,10000``: the same phases once per count of fair groups (docs/groups.md), each
on a queue of its own: the tasks go to that many groups in turn (0: none, a queue without
groups); N is raised to twice the largest count. The bulk enqueue is also shown for its second
half alone, whose tasks all go to groups that are active already (at 10,000 groups each task of
the first half makes its group active). The cycle stops after N of the 1.5 N queued
tasks, so every group still has a task waiting (all of them stay active: the steady cost), then
"tail" runs the rest, where each task is its group's last (the group leaves the active groups),
and the queue's group keys left once it is empty are counted (an idle group must leave none).
``--group-cap N``: the worker's cap per group (DTQ_GROUP_CONCURRENCY) in those claims and
completions (default 0: none).

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


def _task(unset: str = "", group: str = "") -> sc.NewTask:
    """A plain no-op task; ``unset``: what its enqueue left to the declaration (by name);
    ``group``: its fair group (a version without groups is never given one)."""
    kw = {"group": group} if group else {}
    return sc.NewTask(
        new_tid(), "noop", "[]", "", 5, DEFAULT_MAX_RETRIES, None, 0, 0, "", "", unset=unset, **kw
    )


def _outcomes(raw: Any) -> list[Any]:
    """The successes of a claim reply's runs, as the worker sends them: with what the claim
    told of each record where this version has it (``Success.of``), else (tid, eid, attempt)
    read whatever the fields per run (older versions)."""
    if hasattr(sc.Success, "of"):
        return [sc.Success.of(c, "succeeded", "null") for c in sc.parse_claim("default", raw).runs]
    return [sc.Success(t, e, a, "succeeded", "null") for t, e, a in _runs(raw)]


def _runs(raw: Any) -> list[tuple[str, str, int]]:
    """(tid, eid, attempt) of a claim reply, whatever its fields per run, with its state second
    or (older versions) without."""
    if len(raw) < 4:
        return []
    h = 5 if _s(raw[1]) == "ok" else 4  # the first run's first field
    n = int(raw[h - 1])
    if n <= 0:
        return []
    step = (len(raw) - h - 2) // n  # then held, more (no run here has headers)
    return [
        (_s(raw[h + k * step]), _s(raw[h + 1 + k * step]), int(raw[h + 2 + k * step]))
        for k in range(n)
    ]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _flag(argv: list[str], name: str) -> str | None:
    """The value after ``name`` in argv (both removed), or None."""
    if name not in argv:
        return None
    i = argv.index(name)
    v = argv[i + 1]
    del argv[i : i + 2]
    return v


def main() -> None:
    argv = sys.argv[1:]
    batch = int(_flag(argv, "--batch") or BATCH)  # outcomes (and claims) per call of the cycle
    counts = _flag(argv, "--groups")
    cap = int(_flag(argv, "--group-cap") or 0)
    global HIST
    HIST = HIST and "--no-hist" not in argv
    args = [a for a in argv if a not in ("--keep", "--by-name", "--no-hist")]
    keep = "--keep" in argv
    unset = "mte" if "--by-name" in argv else ""  # (every value the declaration may give)
    n = int(args[0]) if args else 2000
    groups = [int(x) for x in counts.split(",")] if counts else None
    if groups:
        n = max(n, 2 * max(groups))
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
                if re.search(f"^desc: Trigger: dump {re.escape(name)}$", text, re.M):
                    m = re.search(r"^summary: (\d+)", text, re.M)
                    assert m is not None
                    return int(m.group(1)) / max(1, tasks)
            raise RuntimeError(f"no callgrind dump for {name}")

        run = sc.SyncScripts(r).run
        print(f"history: {'on' if HIST else 'off'}")
        if groups is None:
            res = _measure(r, run, phase, Keys("ri").queue("default"), n, unset, batch)
            print(f"bulk enqueue: {res['bulk']:,.0f} instructions per task")
            print(f"single enqueue: {res['single']:,.0f} instructions per task")
            print(f"claim + complete ({batch} per call): {res['cycle']:,.0f} per task")
            return
        print(
            f"{n:,} tasks in bulk, {n // 2:,} one by one; claim + complete {batch} per call"
            + (f", group cap {cap}" if cap else "")
        )
        print(
            "groups | bulk enqueue | its second half | single enqueue | claim + complete | tail"
            " | group keys left"
        )
        rows: dict[int, dict[str, float]] = {}
        for k in groups:
            qk = Keys(f"ri{k}").queue("default")
            res = rows[k] = _measure(r, run, phase, qk, n, unset, batch, groups=k, cap=cap)
            cells = []
            for f in ("bulk", "bulk_active", "single", "cycle", "tail"):
                cell = f"{res[f]:,.0f}"
                if 0 in rows and k != 0:
                    cell += f" ({res[f] / rows[0][f]:.2f}x)"
                cells.append(cell)
            print(f"{k:,} | " + " | ".join(cells) + f" | {res['keys_left']:.0f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        if keep:
            print(f"callgrind dumps kept in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)


def _measure(
    r: redis.Redis, run: Any, phase: Any, qk: Any, n: int, unset: str, batch: int,
    groups: int | None = None, cap: int = 0,
) -> dict[str, float]:  # fmt: skip
    """The phases on queue ``qk``: bulk enqueue, single enqueue, claim + complete; with
    ``groups`` (a count, 0: none) the tasks go to that many groups in turn, the cycle stops after
    ``n`` tasks, then the tail (the rest) and the group keys left are measured."""
    for s in qk.streams:
        r.xgroup_create(s, GROUP, id="0", mkstream=True)
    hist: dict[str, Any] = {"hist_ttl_s": 168 * 3600} if HIST else {}

    def done_hist(outs: list[Any]) -> dict[str, Any]:  # each run in the 1 ms bucket
        return {"hist": sc.History(168 * 3600, [0] * len(outs))} if HIST else {}

    if unset:  # what a worker declares for a plain task
        r.hset(qk.decl, "noop", declared.encode(TaskDefaults()))
    # Loads the scripts outside the measure.
    run(sc.enqueue_call(qk, [_task(unset), _task(unset)], EM, **hist))
    done = _outcomes(run(sc.claim_call(qk, "w0", 2, EM, TTL)))
    run(sc.complete_call(qk, "w0", done, EM, TTL, claim=1, **done_hist(done)))
    made = 0

    def task() -> sc.NewTask:
        nonlocal made
        made += 1
        return _task(unset, f"g{made % groups}" if groups else "")

    def bulk(count: int) -> int:
        for i in range(0, count, 500):
            run(sc.enqueue_call(qk, [task() for _ in range(min(500, count - i))], EM, **hist))
        return count

    def single() -> int:
        for _ in range(n // 2):
            run(sc.enqueue_call(qk, [task()], EM, **hist))
        return n // 2

    def cycle(stop: int | None) -> int:
        gc = {"group_cap": cap} if cap else {}
        outs, count = _outcomes(run(sc.claim_call(qk, "w1", batch, EM, TTL, **gc))), 0
        while outs:
            count += len(outs)
            more = batch if stop is None or count + batch <= stop else max(0, stop - count)
            raw = run(
                sc.complete_call(qk, "w1", outs, EM, TTL, claim=more, **done_hist(outs), **gc)
            )
            outs = _outcomes(raw[-1]) if more and raw and isinstance(raw[-1], list) else []
        return count

    at = "" if groups is None else f" g{groups}"  # each dump's name says its queue
    # In two halves: with as many groups as the first half has tasks (10,000 of 20,000), each of
    # its tasks makes its group active, and the second half's each go to an active group.
    first = phase("bulk" + at, lambda: bulk(n // 2))
    second = phase("bulk2" + at, lambda: bulk(n - n // 2))
    res = {"bulk": (first * (n // 2) + second * (n - n // 2)) / n, "bulk_active": second}
    res["single"] = phase("single" + at, single)
    if groups is None:
        res["cycle"] = phase("cycle", lambda: cycle(None))
        return res
    res["cycle"] = phase("cycle" + at, lambda: cycle(n))
    res["tail"] = phase("tail" + at, lambda: cycle(None))
    res["keys_left"] = len(list(r.scan_iter(match=qk.task_base[:-2] + "g:*", count=1000)))
    return res


if __name__ == "__main__":
    main()
