"""Medians, ratios, targets and the two result files (results.json, results.md)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dtq_bench import fairness, flowcost, scalereport

Rec = dict[str, Any]
DTQ = "dtq"
# (workload, metric, what a reader should know, higher is better?)
METRICS: list[tuple[str, str, str, bool]] = [
    ("A", "tasks_per_s", "no-op tasks/s, 1 worker process, concurrency 32", True),
    (
        "A",
        "steady_tasks_per_s",
        "no-op tasks/s from the first completion (start-up excluded)",
        True,
    ),
    (
        "A2",
        "tasks_per_s",
        "no-op tasks/s, 2 worker processes x 32 (dtq-worker --processes 2, dramatiq "
        "--processes 2, taskiq --workers 2, ...)",
        True,
    ),
    (
        "A100",
        "tasks_per_s",
        "no-op tasks/s, 1 worker process, concurrency 100 (BullMQ's 'processing at "
        "concurrency 100')",
        True,
    ),
    ("A100", "steady_tasks_per_s", "the same, from the first completion", True),
    (
        "P",
        "tasks_per_s",
        "20,000 queued no-op tasks, 10 worker processes (each library's default concurrency; "
        "rq worker-pool -n 10)",
        True,
    ),
    ("P", "seconds", "the same: seconds from the workers' start to the last completion", False),
    ("B", "single_per_s", "enqueues/s one by one (BullMQ's 'single add')", True),
    ("B", "bulk_per_s", "enqueues/s with the library's bulk call (BullMQ's 'bulk add')", True),
    ("C", "p50_ms", "pickup latency p50 (ms)", False),
    ("C", "p95_ms", "pickup latency p95 (ms)", False),
    ("C", "p99_ms", "pickup latency p99 (ms)", False),
    ("D", "tasks_per_s", "10 ms I/O tasks/s, concurrency 100", True),
    ("D", "steady_tasks_per_s", "10 ms I/O tasks/s from the first completion", True),
]


def median_record(runs: Sequence[Rec]) -> Rec:
    """Per key: the median of the numeric values of the runs without an error."""
    ok = [r for r in runs if not r.get("error")]
    out: Rec = {"runs": len(runs), "ok_runs": len(ok)}
    errors = [str(r["error"]) for r in runs if r.get("error")]
    if errors:
        out["errors"] = errors
    if not ok:
        return out
    for key in ok[0]:
        vals = [r.get(key) for r in ok]
        nums = [float(v) for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(nums) == len(vals):
            out[key] = round(statistics.median(nums), 3)
            if len(nums) > 1 and key.endswith(("_per_s", "_ms", "_us", "_us_per_task")):
                out[key + "_range"] = [min(nums), max(nums)]
        elif key.endswith("_by_node") and all(isinstance(v, list) for v in vals):
            # Per node (S's shards): the median of each node's values.
            cols = zip(*vals, strict=True)
            out[key] = [round(statistics.median(float(x) for x in col), 3) for col in cols]
        else:
            # A list (E's timed runs) is kept for every run; text (the setting) from the first.
            out[key] = vals if any(isinstance(v, list) for v in vals) else vals[0]
    return out


def medians(runs: dict[str, dict[str, list[Rec]]]) -> dict[str, dict[str, Rec]]:
    return {w: {lib: median_record(rs) for lib, rs in libs.items()} for w, libs in runs.items()}


def _get(med: dict[str, dict[str, Rec]], w: str, lib: str, metric: str) -> float | None:
    v = med.get(w, {}).get(lib, {}).get(metric)
    return float(v) if isinstance(v, int | float) else None


def rows(med: dict[str, dict[str, Rec]]) -> list[Rec]:
    """One row per (workload, metric, library) with the ratio dtq/library."""
    out: list[Rec] = []
    for w, metric, label, higher in METRICS:
        d = _get(med, w, DTQ, metric)
        for lib in med.get(w, {}):
            v = _get(med, w, lib, metric)
            ratio = round(d / v, 2) if d is not None and v else None
            out.append(
                {
                    "workload": w,
                    "metric": metric,
                    "label": label,
                    "lib": lib,
                    "median": v,
                    "ratio_dtq_per_lib": ratio,
                    "higher_is_better": higher,
                    "error": "; ".join(med[w][lib].get("errors", []))[:300] or None,
                }
            )
    return out


def _best_peer(
    med: dict[str, dict[str, Rec]], w: str, metric: str, *, lowest: bool = False
) -> tuple[str, float] | None:
    """The peer with the highest ``metric`` in workload ``w`` (the lowest with ``lowest``)."""
    best: tuple[str, float] | None = None
    for lib in med.get(w, {}):
        if lib.startswith(DTQ):
            continue
        v = _get(med, w, lib, metric)
        if v is not None and (best is None or (v < best[1] if lowest else v > best[1])):
            best = (lib, v)
    return best


def _vs_peer(
    tid: str, text: str, ours: float | None, peer: tuple[str, float] | None, times: float
) -> Rec:
    """A target of dtq's rate being ``times`` the best peer's."""
    if ours is None or not peer:
        return {"id": tid, "target": text, "measured": "no peer results", "met": None}
    measured = f"{ours:,.0f}/s vs {peer[0]} {peer[1]:,.0f}/s = {ours / peer[1]:.2f}x"
    return {"id": tid, "target": text, "measured": measured, "met": ours >= times * peer[1]}


def targets(med: dict[str, dict[str, Rec]]) -> list[Rec]:
    """The issue's targets, each with what was measured and whether it is met."""
    out: list[Rec] = []

    def add(tid: str, text: str, measured: str, met: bool | None) -> None:
        out.append({"id": tid, "target": text, "measured": measured, "met": met})

    a = _get(med, "A", DTQ, "tasks_per_s")
    peer = _best_peer(med, "A", "tasks_per_s")
    out.append(_vs_peer("A-peers", ">= 3x the fastest peer (A, 1 process)", a, peer, 3))
    steady = _get(med, "A", DTQ, "steady_tasks_per_s")
    out.append(
        _vs_peer(
            "A-peers-5x",
            ">= 5x the fastest peer, steady rates (A, 1 process)",
            steady,
            _best_peer(med, "A", "steady_tasks_per_s"),
            5,
        )
    )
    g = _get(med, "G", "asyncio", "tasks_per_s")
    if a is not None and g:
        add(
            "A-ceiling",
            ">= 50% of the asyncio ceiling (G)",
            f"{a:,.0f}/s vs {g:,.0f}/s = {100 * a / g:.0f}%",
            a >= 0.5 * g,
        )
    if a is not None:
        add("A-11k", ">= ~11k tasks/s from one worker process", f"{a:,.0f}/s", a >= 11_000)
    cpu1, cpu2 = (_get(med, w, DTQ, "worker_cpu_us_per_task") for w in ("A", "A2"))
    if cpu1 and cpu2 is not None:  # whole runs: a pool's start-up counts
        add(
            "A2-cpu",
            "worker CPU per task at --processes 2 within 10% of one process (A2 vs A)",
            f"{cpu2:.1f} vs {cpu1:.1f} µs = {cpu2 / cpu1:.2f}x",
            cpu2 <= 1.1 * cpu1,
        )
    bulk = _get(med, "B", DTQ, "bulk_per_s")
    pbulk = _best_peer(med, "B", "bulk_per_s")
    out.append(_vs_peer("B-bulk", ">= 5x the fastest peer's bulk enqueue", bulk, pbulk, 5))
    single = _get(med, "B", DTQ, "single_per_s")
    # The raw XADD loop run interleaved with the single enqueues in B (same moments of the
    # machine); G's separate loop only for results written before B measured it.
    xadd = _get(med, "B", DTQ, "raw_xadd_per_s") or _get(med, "G", "xadd_single", "tasks_per_s")
    if single is not None and xadd:
        add(
            "B-single",
            ">= 90% of an unpipelined raw XADD loop (interleaved with it in B)",
            f"{single:,.0f}/s vs {xadd:,.0f}/s = {100 * single / xadd:.0f}%",
            single >= 0.9 * xadd,
        )
    p50, p99 = _get(med, "C", DTQ, "p50_ms"), _get(med, "C", DTQ, "p99_ms")
    if p50 is not None and p99 is not None:
        add(
            "C-abs",
            "pickup p50 <= 1 ms and p99 <= 1.5 ms",
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
            p50 <= 1.0 and p99 <= 1.5,
        )
        add("C-p99", "idle pickup p99 <= 1.0 ms", f"p99 {p99:.2f} ms", p99 <= 1.0)
        b50, b99 = (
            _best_peer(med, "C", "p50_ms", lowest=True),
            _best_peer(med, "C", "p99_ms", lowest=True),
        )
        if b50 and b99:
            add(
                "C-peers",
                "better than every peer (p50 and p99)",
                f"best peer p50 {b50[1]:.2f} ms ({b50[0]}), p99 {b99[1]:.2f} ms ({b99[0]})",
                p50 < b50[1] and p99 < b99[1],
            )
    # A run that ends between two polls of the done counter (a --quick one on a loaded host) has
    # no steady window: then the whole run, worker start included, is what there is.
    d = _get(med, "D", DTQ, "steady_tasks_per_s")
    d_whole = d is None
    if d_whole:
        d = _get(med, "D", DTQ, "tasks_per_s")
    if d is not None:
        add(
            "D",
            ">= 85% of the ideal 10,000 tasks/s (steady: first to last completion)",
            f"{d:,.0f}/s = {d / 100:.0f}%" + (" (whole run: no steady window)" if d_whole else ""),
            d >= 8_500,
        )
    e = {lib: v for lib, v in med.get("E", {}).items() if lib.startswith(DTQ)}
    # Steady rates where every size has one; a run short enough to finish between two polls of
    # the done counter has none, and then all sizes compare worker start to done instead.
    field = "steady_tasks_per_s"
    if not all(isinstance(r.get(field), int | float) for r in e.values()):
        field = "tasks_per_s"
    sizes = sorted(
        (int(r["backlog"]), float(r[field]))
        for r in e.values()
        if isinstance(r.get(field), int | float)
    )
    if len(sizes) >= 2:
        (lo, r_lo), (hi, r_hi) = sizes[0], sizes[-1]
        add(
            "E",
            f"throughput ({field}) with {hi:,} queued within 10% of {lo:,} queued",
            f"{r_hi:,.0f}/s vs {r_lo:,.0f}/s = {100 * r_hi / r_lo:.0f}%",
            r_hi >= 0.9 * r_lo,
        )
    f = _get(med, "F", DTQ, "bytes_per_queued_task")
    if f is not None:
        add("F", "<= 400 bytes of Redis memory per queued task", f"{f:.0f} bytes", f <= 400)
    scalereport.targets(med.get("S", {}), add)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _runs(v: Any) -> str:
    """E's timed runs: one list per repetition (or one list when there was one repetition)."""
    if not isinstance(v, list) or not v:
        return ""
    reps = v if isinstance(v[0], list) else [v]
    return "; ".join(", ".join(_fmt(x) for x in rep) for rep in reps)


def _burn_down(m: dict[str, Rec]) -> list[str]:
    """M: the burn-down rows (no persistence / AOF everysec) side by side."""
    cols = (
        ("tasks_per_s", "tasks/s"),
        ("steady_tasks_per_s", "steady tasks/s"),
        ("worker_cpu_us_per_task", "worker CPU µs/task"),
        ("redis_cpu_us_per_task", "Redis CPU µs/task"),
        ("p50_ms", "pickup p50 ms"),
        ("p99_ms", "pickup p99 ms"),
        ("aof_bytes_per_task", "AOF bytes/task"),
    )
    n = next((r.get("n") for r in m.values() if isinstance(r.get("n"), int | float)), None)
    lines = [
        f"## M: burn-down of {int(n or 0):,} queued no-op tasks, 1 worker process x 32 (dtq)",
        "",
        "Prefilled in bulk, timed from the worker's start to the last completion; then pickup "
        "latency (C's tasks 5 ms apart) with the queue empty, on the same server.",
        "",
        "| redis-server | " + " | ".join(h for _, h in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for row, rec in m.items():
        if rec.get("errors"):
            lines.append(f"| {row} | error: {'; '.join(rec['errors'])[:120]} |")
            continue
        lines.append(f"| {row} | " + " | ".join(_fmt(rec.get(k)) for k, _ in cols) + " |")
    return [*lines, ""]


def markdown(data: Rec) -> str:
    med: dict[str, dict[str, Rec]] = data["medians"]
    meta = data["meta"]
    lines = [
        "# dtq benchmark results",
        "",
        f"Run {meta['started']} on {meta['machine']}; Redis {meta['redis']}, Python "
        f"{meta['python']}. Medians of {meta['reps']} runs (min-max in brackets). "
        f"Load average before/after: {meta['load_before']} / {meta.get('load_after', '-')}.",
        "",
        "Every library runs the same task bodies (no-op = count itself done in-process; a thread "
        "of the worker process INCRBYs the shared counter every 1 ms, which is how completion is "
        "detected; rq, which forks per job, INCRs per task) against the same private "
        "redis-server, one library at a time. Ratio = dtq / library (for latency, lower is "
        "better, so a ratio below 1 favours dtq).",
        "",
    ]
    if meta.get("peers_note"):
        lines += [f"Peers: {meta['peers_note']}", ""]
    for w, metric, label, _higher in METRICS:
        libs = med.get(w, {})
        if not libs:
            continue
        lines += [
            f"## {w}: {label}",
            "",
            "| library | setting | median | range | dtq / lib |",
            "|---|---|---:|---|---:|",
        ]
        d = _get(med, w, DTQ, metric)
        for lib, rec in libs.items():
            v = _get(med, w, lib, metric)
            rng = rec.get(metric + "_range")
            rng_s = f"{_fmt(rng[0])}-{_fmt(rng[1])}" if rng else ""
            ratio = _fmt(round(d / v, 2)) if d is not None and v else "-"
            errors = "; ".join(rec.get("errors", []))[:120]
            if v is not None:
                val = _fmt(v)
            elif errors:
                val = "error: " + errors
            else:
                val = "no such call" if metric == "bulk_per_s" else "-"
            setting = str(rec.get("setting", ""))[:70]
            if isinstance(rec.get("n"), int | float) and w in ("A", "A2", "A100", "P", "D"):
                setting += f" (n={int(rec['n']):,})"
            lines.append(f"| {lib} | {setting} | {val} | {rng_s} | {ratio} |")
        lines.append("")
    if med.get("E"):
        lines += [
            "## E: backlog scaling (dtq)",
            "",
            "Per repetition, every size in turn; per size the median of several timed runs "
            "(all listed, steady tasks/s), then the median over the repetitions.",
            "",
            "| backlog queued | tasks/s (worker start to done) | steady tasks/s | range | runs |",
            "|---:|---:|---:|---|---|",
        ]
        for lib, rec in med["E"].items():
            rng = rec.get("steady_tasks_per_s_range")
            rng_s = f"{_fmt(rng[0])}-{_fmt(rng[1])}" if rng else ""
            lines.append(
                f"| {lib} | {_fmt(rec.get('tasks_per_s'))} | "
                f"{_fmt(rec.get('steady_tasks_per_s'))} | {rng_s} | "
                f"{_runs(rec.get('runs_steady_tasks_per_s'))} |"
            )
        lines.append("")
    if med.get("M"):
        lines += _burn_down(med["M"])
    f = med.get("F", {}).get(DTQ)
    if f:
        lines += ["## F: resources (dtq)", "", "| measure | value |", "|---|---:|"]
        for k in (
            "bytes_per_queued_task",
            "bytes_per_finished_task_kept",
            "worker_rss_mib",
            "commands_per_task",
            "script_calls_per_task",
        ):
            lines.append(f"| {k} | {_fmt(f.get(k))} |")
        by = f.get("commands_per_task_by_name") or {}
        if by:
            top = ", ".join(f"{k} {v}" for k, v in list(by.items())[:12])
            lines += ["", f"Commands per task by name: {top}."]
        lines.append("")
    g = med.get("G", {})
    if g:
        lines += [
            "## G: ceiling (raw redis-py + hiredis, stream operations only)",
            "",
            "| loop | tasks/s | range |",
            "|---|---:|---|",
        ]
        for name, rec in g.items():
            rng = rec.get("tasks_per_s_range")
            rng_s = f"{_fmt(rng[0])}-{_fmt(rng[1])}" if rng else ""
            lines.append(f"| {name} | {_fmt(rec.get('tasks_per_s'))} | {rng_s} |")
        lines.append("")
    if med.get("S"):
        lines += scalereport.markdown(med["S"], med.get("A2", {}), _fmt)
    if med.get("T"):
        lines += fairness.markdown(med["T"], _fmt)
    wcost = med.get("W", {}).get(DTQ)
    if wcost:
        lines += flowcost.markdown(wcost, _fmt)
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in data["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['id']}: {t['target']} | {t['measured']} | {met} |")
    lines.append("")
    return "\n".join(lines)


def write(out_dir: Path, data: Rec) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j = out_dir / "results.json"
    m = out_dir / "results.md"
    j.write_text(json.dumps(data, indent=1, default=str) + "\n")
    m.write_text(markdown(data))
    return j, m
