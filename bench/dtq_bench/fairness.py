"""Workload T, fair groups (docs/groups.md): does one group's backlog hold new groups back?

One worker process at dtq's default settings (concurrency 16, no prefetch). ``backlog`` no-op
tasks of one group (``big``) are queued in bulk and the worker starts on them; once it has run a
fifth of them, ``groups`` new groups arrive ``spacing_s`` apart, each with
``per_group`` tasks in one ``enqueue_many`` call. A new group's task records its group, its
enqueue time and its start (the ``fair`` task, :mod:`dtq_bench.tasks`); the big group's starts
are read from the done counter, sampled at every poll (a no-op ends as it starts). The run ends
when every new task has started. The row "no groups" does the same with every task ungrouped:
then the new tasks wait behind what is left of the backlog.

Reported per row: each new group's first-start delay (from its enqueue to its first task's
start: p50, p99, max), every new task's start delay (p50, p99), the seconds from the first
arrival to the last new task's start, the big group's share of the starts in that span and
the start rate over it (a fair queue keeps serving the big group: work conserving), the big
group's rate before the arrivals, from its first tenth done to its fifth (alone, it has the
whole worker), and the starts per window of ``window_s`` from the first arrival (big, new) in
results.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dtq.settings import Settings
from dtq_bench.shared import DONE_KEY, FAIR_KEY, pct
from dtq_bench.workloads import CHUNK, POLL_S, QUEUE, DtqBench, Result

BIG = "big"
GROUPS, PER_GROUP, SPACING_S, WINDOW_S = 100, 10, 0.01, 0.1
ROWS = (("dtq groups", True), ("dtq no groups", False))


def fairness(
    b: DtqBench, backlog: int, *, grouped: bool, groups: int = GROUPS,
    per_group: int = PER_GROUP, spacing_s: float = SPACING_S, window_s: float = WINDOW_S,
) -> Result:  # fmt: skip
    """One row of T (see the module's text); ``grouped``: the tasks carry their groups."""
    b.flush()
    big: dict[str, Any] = {"name": "noop", "queue": QUEUE}
    if grouped:
        big["group"] = BIG
    with b.client() as c:
        for start in range(0, backlog, CHUNK):
            c.enqueue_many([big] * min(CHUNK, backlog - start))
    defaults = Settings.model_fields
    conc = int(defaults["worker_concurrency"].default)
    w = b.workers(conc, prefetch=int(defaults["worker_prefetch"].default))
    samples: list[tuple[float, int]] = []  # (epoch s, big tasks done)
    arrived: dict[str, float] = {}
    n_new = groups * per_group
    deadline = time.monotonic() + b.timeout
    try:
        w.start()
        with b.server.client() as r, b.client() as c:

            def poll(until: Callable[[], bool]) -> None:
                while not until():
                    samples.append((time.time(), int(r.get(DONE_KEY) or 0)))
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"T: {r.llen(FAIR_KEY)}/{n_new} new tasks started")
                    w.check()
                    time.sleep(POLL_S)

            poll(lambda: bool(samples) and samples[-1][1] >= max(1, backlog // 10))
            t_a, n_a = samples[-1]
            # (A later sample with more done: a slow poll may see both marks at once. From the
            # first sample when the whole backlog was done by then.)
            poll(lambda: samples[-1][1] >= max(2, backlog // 5, n_a + 1) or n_a >= backlog)
            t_b, n_b = samples[-1]
            if t_b <= t_a:
                t_a, n_a = samples[0]
            nxt = time.monotonic()
            for g in range(groups):
                poll(lambda: time.monotonic() >= nxt)  # noqa: B023
                name = f"new{g}"
                at = time.time()
                item: dict[str, Any] = {"name": "fair", "args": [name, at], "queue": QUEUE}
                if grouped:
                    item["group"] = name
                c.enqueue_many([item] * per_group)
                arrived[name] = at
                nxt += spacing_s
            poll(lambda: int(r.llen(FAIR_KEY)) >= n_new)
            samples.append((time.time(), int(r.get(DONE_KEY) or 0)))
            lines = [x if isinstance(x, str) else x.decode() for x in r.lrange(FAIR_KEY, 0, -1)]
    finally:
        w.cleanup()
    b.flush()
    res = summary(arrived, lines, samples, window_s)
    res["big_alone_per_s"] = round((n_b - n_a) / (t_b - t_a), 1) if t_b > t_a else None
    setting = f"1 process x concurrency {conc}, prefetch {w.prefetch} (dtq's defaults)"
    return {
        "backlog": backlog, "groups": groups, "per_group": per_group,
        "spacing_ms": spacing_s * 1000, "grouped": grouped, "setting": setting,
    } | res  # fmt: skip


def summary(
    arrived: dict[str, float], lines: list[str], samples: list[tuple[float, int]],
    window_s: float,
) -> Result:  # fmt: skip
    """The figures of one row from the new groups' arrivals, their tasks' stamps ("<group>
    <enqueued> <started>") and the samples of the big group's done counter."""
    first: dict[str, float] = {}
    waits: list[float] = []
    starts: list[float] = []
    for line in lines:
        grp, enq, st = line.split()
        started = float(st)
        starts.append(started)
        waits.append((started - float(enq)) * 1000)
        first[grp] = min(first.get(grp, started), started)
    firsts = sorted((first[g] - arrived[g]) * 1000 for g in first)
    t0, t1 = min(arrived.values()), max(starts)
    big = _count_at(samples, t1) - _count_at(samples, t0)
    new = [0] * (int((t1 - t0) / window_s) + 1)  # the last start is in the last window
    for s in starts:
        new[min(len(new) - 1, max(0, int((s - t0) / window_s)))] += 1
    windows = []
    for k, n in enumerate(new):
        a, z = t0 + k * window_s, t0 + (k + 1) * window_s
        windows.append([round(k * window_s, 3), _count_at(samples, z) - _count_at(samples, a), n])
    waits.sort()
    span = t1 - t0
    return {
        "first_start_p50_ms": pct(firsts, 50),
        "first_start_p99_ms": pct(firsts, 99),
        "first_start_max_ms": round(firsts[-1], 3),
        "new_task_p50_ms": pct(waits, 50),
        "new_task_p99_ms": pct(waits, 99),
        "all_new_started_s": round(span, 3),
        "big_share_while_new_wait": round(big / (big + len(starts)), 3),
        "starts_per_s_while_new_wait": round((big + len(starts)) / span, 1) if span > 0 else None,
        "window_s": window_s,
        "windows_t_big_new": windows,
    }


def _count_at(samples: list[tuple[float, int]], t: float) -> int:
    """The big group's done count at time ``t``: the last sample at or before it."""
    n = 0
    for ts, count in samples:
        if ts > t:
            break
        n = count
    return n


def markdown(rows: dict[str, dict[str, Any]], fmt: Callable[[Any], str]) -> list[str]:
    """The T section of results.md from the median records of its rows."""
    rec = next(iter(rows.values()), {})
    lines = [
        f"## T: fair groups, a backlog of {int(rec.get('backlog') or 0):,} in one group, then "
        f"{int(rec.get('groups') or 0)} new groups of {int(rec.get('per_group') or 0)} tasks "
        f"{rec.get('spacing_ms') or 0:g} ms apart (dtq)",
        "",
        f"{rec.get('setting', '')}. Delays from each enqueue to the start; the span from the "
        "first new group's arrival to the last new task's start.",
        "",
        "| row | new group's first start p50 / p99 / max ms | new task p50 / p99 ms | "
        "all new started (s) | big group's share of starts meanwhile | starts/s meanwhile | "
        "big group alone, tasks/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row, r in rows.items():
        if r.get("errors"):
            lines.append(f"| {row} | error: {'; '.join(r['errors'])[:120]} |")
            continue
        lines.append(
            f"| {row} | {fmt(r.get('first_start_p50_ms'))} / {fmt(r.get('first_start_p99_ms'))}"
            f" / {fmt(r.get('first_start_max_ms'))} | {fmt(r.get('new_task_p50_ms'))} / "
            f"{fmt(r.get('new_task_p99_ms'))} | {fmt(r.get('all_new_started_s'))} | "
            f"{fmt(r.get('big_share_while_new_wait'))} | "
            f"{fmt(r.get('starts_per_s_while_new_wait'))} | {fmt(r.get('big_alone_per_s'))} |"
        )
    return [*lines, ""]
