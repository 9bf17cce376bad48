"""Workload S in the report: the cost table, the CPU split per row, the projection to 10k, 100k
and 1M tasks/s, and its targets (docs/performance.md, "Scale")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Rec = dict[str, Any]
# Each Redis shard and each worker process is planned at this share of one core: the headroom
# for bursts, the reaper and scheduler loops, and a neighbour on the same host.
PLAN_BUSY = 0.7
RATES = (10_000, 100_000, 1_000_000)
TARGET_US = 25.0
LABELS = {
    "server p1": "1 redis-server, 1 worker process",
    "server p2": "1 redis-server, dtq-worker --processes 2",
    "cluster1 p2": "cluster of 1 master, --processes 2 (3 queues)",
    "cluster3 p2": "cluster of 3 masters, --processes 2 (3 queues, 1 per shard)",
}


def _num(rec: Rec | None, key: str) -> float | None:
    v = (rec or {}).get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _nodes(rec: Rec, key: str) -> list[float]:
    v = rec.get(key)
    return [float(x) for x in v] if isinstance(v, list) and v else []


def projection(s: dict[str, Rec]) -> tuple[list[Rec], str]:
    """Shards, worker processes and client cores for each rate in :data:`RATES`, with tasks
    enqueued one by one and in bulk, from the per-task costs measured on the 3-master cluster
    (on one server where the cluster rows are missing); and the method as one paragraph."""
    cost = s.get("cost cluster3") or s.get("cost") or {}
    where = "3-master cluster" if s.get("cost cluster3") else "one server"
    c3 = s.get("cluster3 p2") or {}
    run = _num(c3, "window_redis_cpu_us_per_task") or _num(cost, "run_after_single_redis_us")
    worker = _num(c3, "window_worker_cpu_us_per_task") or _num(
        cost, "run_after_single_worker_cpu_us"
    )
    enq = {h: _num(cost, f"enqueue_{h}_redis_us") for h in ("single", "bulk")}
    client = {h: _num(cost, f"enqueue_{h}_client_us") or 0.0 for h in ("single", "bulk")}
    run_net = _num(cost, "run_after_single_net_bytes") or 0.0
    net = {h: (_num(cost, f"enqueue_{h}_net_bytes") or 0.0) + run_net for h in ("single", "bulk")}
    if run is None or worker is None or enq["single"] is None or enq["bulk"] is None:
        return [], ""
    redis_us = {h: (enq[h] or 0.0) + run for h in ("single", "bulk")}
    cap = PLAN_BUSY * 1e6  # µs of CPU one planned core gives per second

    def need(rate: int, us: float) -> int:
        return math.ceil(rate * us / cap)

    out = [
        {
            "rate": rate,
            "shards_single": need(rate, redis_us["single"]),
            "shards_bulk": need(rate, redis_us["bulk"]),
            "worker_processes": need(rate, worker),
            "client_cores_single": need(rate, client["single"]),
            "client_cores_bulk": need(rate, client["bulk"]),
            "net_mb_s": round(rate * net["single"] / 1e6, 1),
        }
        for rate in RATES
    ]
    method = (
        f"measured on the {where}: Redis {redis_us['single']:.1f} µs per task enqueued one by "
        f"one ({enq['single']:.1f} enqueue + {run:.1f} run) and {redis_us['bulk']:.1f} µs in "
        f"bulk ({enq['bulk']:.1f} + {run:.1f}); worker {worker:.1f} µs/task (--processes 2); "
        f"client {client['single']:.1f} µs per single enqueue, {client['bulk']:.1f} in bulk; "
        f"{net['single']:.0f} bytes/task on the wire. Each shard, worker process and client "
        f"core planned at {PLAN_BUSY:.0%} busy. A queue lives in one slot, so one queue tops "
        f"out at ~{cap / redis_us['single']:,.0f} tasks/s enqueued one by one and "
        f"~{cap / redis_us['bulk']:,.0f} in bulk (its shard is busy): the first limit; past "
        "it the tasks must spread over at least as many queues as shards."
    )
    return out, method


def markdown(s: dict[str, Rec], a2: dict[str, Rec], fmt: Callable[[Any], str]) -> list[str]:
    lines = [
        "## S: scale (dtq)",
        "",
        "Redis CPU from the server's own counters (INFO cpu, used_cpu_user + used_cpu_sys, "
        "deltas over each phase); S's data lives on servers of its own, the done counters on "
        "the suite's server, so these are dtq's alone.",
        "",
    ]
    costs = [(k, s[k]) for k in ("cost", "cost cluster3") if s.get(k)]
    good = [(k, c) for k, c in costs if c.get("ok_runs")]
    if good:
        lines += [
            "| no-op task, enqueued | Redis µs enqueue | Redis µs run | **Redis µs total** | "
            "client µs enqueue | worker µs run | bytes enqueue + run | enqueues/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for key, cost in good:
        where = "3-master cluster" if key.endswith("cluster3") else "one server"
        for how in ("single", "bulk"):
            lines.append(
                f"| {how}, {where} | {fmt(cost.get(f'enqueue_{how}_redis_us'))} | "
                f"{fmt(cost.get(f'run_after_{how}_redis_us'))} | "
                f"**{fmt(cost.get(f'total_{how}_redis_us'))}** | "
                f"{fmt(cost.get(f'enqueue_{how}_client_us'))} | "
                f"{fmt(cost.get(f'run_after_{how}_worker_cpu_us'))} | "
                f"{fmt(cost.get(f'enqueue_{how}_net_bytes'))} + "
                f"{fmt(cost.get(f'run_after_{how}_net_bytes'))} | "
                f"{fmt(cost.get(f'{how}_per_s'))} |"
            )
        for how, label in _CONCURRENT:
            if cost.get(f"total_{how}_redis_us") is None:
                continue
            lines.append(
                f"| {_label(cost, how, label)}, {where} | "
                f"{fmt(cost.get(f'enqueue_{how}_redis_us'))} | "
                f"{fmt(cost.get('run_after_single_redis_us'))} | "
                f"**{fmt(cost.get(f'total_{how}_redis_us'))}** | "
                f"{fmt(cost.get(f'enqueue_{how}_client_us'))} | "
                f"{fmt(cost.get('run_after_single_worker_cpu_us'))} | "
                f"{fmt(cost.get(f'enqueue_{how}_net_bytes'))} + "
                f"{fmt(cost.get('run_after_single_net_bytes'))} | "
                f"{fmt(cost.get(f'{how}_per_s'))} |"
            )
    if good:
        lines.append("")
    for key, cost in good:
        ping = cost.get("request_floor_redis_us")
        if ping is not None:
            where = "3-master cluster's first node" if key.endswith("cluster3") else "server"
            lines += [
                f"The {where}'s floor for one request: {fmt(ping)} µs of CPU per PING sent one "
                "after another by one client (system calls and the wake-up from epoll_wait; no "
                "command is cheaper), which every single enqueue pays before its script runs.",
                "",
            ]
    for key, cost in costs:
        if cost.get("errors"):
            lines += [f"{key}: error: " + "; ".join(cost["errors"])[:300], ""]
    rows = [(k, r) for k, r in s.items() if not k.startswith("cost")]
    if rows:
        lines += [
            "Steady window of each run (from 20% of the tasks done to the last): tasks/s, CPU "
            "µs per task and cores busy, for the workers (pool parent and children) and each "
            "Redis node; tasks/s per busy core = tasks/s over all the cores those processes "
            "kept busy.",
            "",
            "| row | tasks/s | worker µs/task | worker cores | Redis µs/task (per node) | "
            "Redis cores (per node) | tasks/s per busy core |",
            "|---|---:|---:|---:|---|---|---:|",
        ]
        for key, r in rows:
            if r.get("errors") and not r.get("ok_runs"):
                lines.append(f"| {key} | error: {'; '.join(r['errors'])[:150]} | | | | | |")
                continue
            rate = _num(r, "window_tasks_per_s")
            wc = _num(r, "window_worker_cores")
            rc = _nodes(r, "window_redis_cores_by_node")
            per_core = rate / (wc + sum(rc)) if rate and wc is not None and wc + sum(rc) else None
            ru = _nodes(r, "window_redis_cpu_us_per_task_by_node")
            lines.append(
                f"| {LABELS.get(key, key)} | {fmt(rate)} | "
                f"{fmt(_num(r, 'window_worker_cpu_us_per_task'))} | {fmt(wc)} | "
                f"{fmt(_num(r, 'window_redis_cpu_us_per_task'))}"
                + (f" ({' / '.join(fmt(x) for x in ru)})" if len(ru) > 1 else "")
                + f" | {' / '.join(fmt(x) for x in rc) or '-'} | {fmt(per_core)} |"
            )
        lines.append("")
    for metric, what in (
        ("tasks_per_s", "worker start to last completion"),
        ("steady_tasks_per_s", "first completion to last"),
    ):
        dtq2 = _num(a2.get("dtq"), metric)
        peers = [(lib, _num(r, metric)) for lib, r in a2.items() if not lib.startswith("dtq")]
        best = max(((lib, v) for lib, v in peers if v), key=lambda x: x[1], default=None)
        if dtq2 is not None and best:
            lines += [
                f"A2, {what}: dtq on one server at `--processes 2` {dtq2:,.0f} tasks/s; the "
                f"fastest peer at 2 processes, {best[0]}, {best[1]:,.0f} tasks/s = "
                f"{dtq2 / best[1]:.2f}x (same harness).",
                "",
            ]
    proj, method = projection(s)
    if proj:
        lines += [
            "Projection (planning figures from the costs above, not measured at these rates): "
            + method,
            "",
            "| tasks/s | Redis shards (single / bulk enqueue) | worker processes | "
            "client cores (single / bulk) | network MB/s (all shards) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for p in proj:
            lines.append(
                f"| {p['rate']:,} | {p['shards_single']:,} / {p['shards_bulk']:,} | "
                f"{p['worker_processes']:,} | {p['client_cores_single']:,} / "
                f"{p['client_cores_bulk']:,} | {fmt(p['net_mb_s'])} |"
            )
        lines.append("")
    return lines


def _floor(cost: Rec) -> str:
    """The server's CPU for one request alone (a PING), which each single enqueue pays."""
    ping = _num(cost, "request_floor_redis_us")
    return "" if ping is None else f" (one PING alone: {ping:.1f} µs)"


def targets(s: dict[str, Rec], add: Callable[[str, str, str, bool | None], None]) -> None:
    cost = s.get("cost") or {}
    # (the figures' key, what is enqueued, the run it is costed with)
    rows = [("single", "single enqueue", "single"), ("bulk", "bulk enqueue", "bulk")]
    rows += [
        (how, _label(cost, how, label).replace("single", "single enqueues"), "single")
        for how, label in _CONCURRENT
    ]
    for how, what, run in rows:
        total = _num(cost, f"total_{how}_redis_us")
        if total is None:
            continue
        add(
            f"S-cpu-{how}",
            f"<= {TARGET_US:g} µs Redis CPU per enqueued-and-completed no-op task ({what} + run)",
            f"{_num(cost, f'enqueue_{how}_redis_us') or 0:.1f} + "
            f"{_num(cost, f'run_after_{run}_redis_us') or 0:.1f} = {total:.1f} µs"
            + (_floor(cost) if how == "single" else ""),
            total <= TARGET_US,
        )


# The rows of single enqueues made at once by many callers of one client (each coalesced):
# the key of its figures, and its label ({k}: how many callers, from the count's key).
_CONCURRENT = (
    ("coalesced", "single from {k} coroutines (one AsyncClient)"),
    ("threaded", "single from {k} threads (one Client)"),
)
_COUNT_KEY = {"coalesced": "coroutines", "threaded": "threads"}


def _label(cost: Rec, how: str, label: str) -> str:
    return label.format(k=int(cost.get(_COUNT_KEY[how]) or 0))
