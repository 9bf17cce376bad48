"""``dtq bench`` / ``make bench``: dtq measured side by side with the peer task queues.

The suite starts its own ``redis-server`` on a free port, runs workloads A-G (see
docs/performance.md), S (scale: Redis CPU per task, worker processes, cluster shards; on
servers of its own, :mod:`dtq_bench.scale`), W (workflow cost, docs/workflows.md) and T (fair
groups, :mod:`dtq_bench.fairness`) against dtq and, when
``bench/peers`` and its virtualenv are available, against each peer through
``bench/peers/run_peer.py``; each run is repeated (3 times by default) and the medians are
written to ``build/bench/results.md`` and ``results.json`` with the ratio
dtq/peer per row and the issue's targets marked met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dtq_bench import ceiling, fairness, flowcost, report, shapes
from dtq_bench.peers import LIBS, VARIANTS, Peers, repo_root
from dtq_bench.scale import ROWS, ScaleBench
from dtq_bench.server import BenchRedis
from dtq_bench.workloads import DtqBench

ALL = "ABCDEFGSWMPT"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dtq bench",
        description="Benchmark dtq against its peers on a private redis-server "
        "(workloads A-G, see docs/performance.md; S: scale, Redis CPU per task, worker "
        "processes and cluster shards; W: workflow cost, docs/workflows.md; M: burn-down of "
        "1M queued tasks, with and without AOF; P: 20,000 tasks, 10 worker processes; T: fair "
        "groups, a 100,000-task backlog in one group and 100 new groups).",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="shrink every size (10x fewer tasks, backlogs 1k/10k, 1 repetition)",
    )
    p.add_argument("--reps", type=int, help="repetitions per measurement (default 3; 1 if --quick)")
    p.add_argument(
        "--workloads", default=ALL, help="which of A-G, S, W, M, P and T to run (default: all)"
    )
    p.add_argument(
        "--peers",
        default="all",
        help="'all', 'none' or a comma-separated list of: " + ", ".join(LIBS),
    )
    p.add_argument(
        "--no-setup-peers",
        action="store_true",
        help="do not run bench/setup_peers.sh when the peers' virtualenv is missing",
    )
    p.add_argument(
        "--variants",
        action="store_true",
        help="also run the peers' alternative settings (rows 'lib:variant'; A and C)",
    )
    p.add_argument("--peer-timeout", type=float, default=600.0, help="seconds per peer run")
    p.add_argument("--n-a", type=int, help="A: tasks (default 20000)")
    p.add_argument("--n-b", type=int, help="B: enqueues (default 20000)")
    p.add_argument("--n-c", type=int, help="C: tasks 5 ms apart (default 1000)")
    p.add_argument("--n-d", type=int, help="D: 10 ms tasks (default 5000)")
    p.add_argument("--n-e", type=int, help="E: tasks timed per backlog size (default 20000)")
    p.add_argument(
        "--e-runs", type=int, help="E: timed runs per size and repetition, median kept (default 3)"
    )
    p.add_argument("--backlogs", help="E: backlog sizes (default 1000,100000,1000000)")
    p.add_argument("--n-f", type=int, help="F: tasks queued to measure memory (default 100000)")
    p.add_argument("--n-g", type=int, help="G: tasks per ceiling loop (default 50000)")
    p.add_argument("--n-w", type=int, help="W: tasks per workflow-cost scenario (default 4000)")
    p.add_argument("--n-s", type=int, help="S: tasks per scale row (default 20000)")
    p.add_argument("--n-m", type=int, help="M: tasks of the burn-down (default 1000000)")
    p.add_argument("--n-p", type=int, help="P: tasks for 10 worker processes (default 20000)")
    p.add_argument("--n-t", type=int, help="T: the big group's backlog (default 100000)")
    p.add_argument(
        "--peer-n",
        default="rq:A=4000,rq:D=1000",
        help="smaller task counts for slow peers, LIB:WORKLOAD=N,... (default rq:A=4000,rq:D=1000:"
        " rq runs about 200 tasks/s here, so 20,000 would take minutes per run; A's cap holds for"
        " the rows run as A: A2, A100, P, unless given as rq:P=N); 'none' for none",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        help="dtq workers' DTQ_LOG_LEVEL (default WARNING, as the peers run)",
    )
    p.add_argument("--out", type=Path, help="output directory (default build/bench)")
    return p


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    q = args.quick
    pick: Callable[[int | None, int, int], int] = lambda v, full, quick: (  # noqa: E731
        v if v is not None else (quick if q else full)
    )
    backlogs = args.backlogs or ("1000,10000" if q else "1000,100000,1000000")
    return {
        "A": pick(args.n_a, 20_000, 2_000),
        "B": pick(args.n_b, 20_000, 2_000),
        "C": pick(args.n_c, 1_000, 100),
        "D": pick(args.n_d, 5_000, 500),
        "E": pick(args.n_e, 20_000, 2_000),
        "E_sizes": [int(x) for x in backlogs.split(",") if x.strip()],
        "E_runs": pick(args.e_runs, 3, 1),
        "F": pick(args.n_f, 100_000, 10_000),
        "G": pick(args.n_g, 50_000, 5_000),
        "W": pick(args.n_w, 4_000, 500),
        "S": pick(args.n_s, 20_000, 2_000),
        "M": pick(args.n_m, 1_000_000, 100_000),
        "P": pick(args.n_p, 20_000, 2_000),
        "T": pick(args.n_t, 100_000, 10_000),
        "reps": args.reps or (1 if q else 3),
    }


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu}){mem}"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the private redis-server and the workers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sz = _sizes(args)
    reps = sz["reps"]
    wanted = {c for c in args.workloads.upper() if c in ALL}
    root = repo_root()
    out_dir = args.out or root / "build" / "bench"

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    libs: list[str] = []
    peers = Peers(root, say)
    peers_note = ""
    if args.peers != "none":
        chosen = list(LIBS) if args.peers == "all" else [x.strip() for x in args.peers.split(",")]
        unknown = [x for x in chosen if x not in LIBS]
        if unknown:
            print(f"dtq bench: unknown peer(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        if peers.available(setup=not args.no_setup_peers):
            libs = chosen
        else:
            peers_note = f"not run ({peers.why_not})"
            say(f"peers skipped: {peers.why_not}")
    else:
        peers_note = "not run (--peers none)"

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    meta: dict[str, Any] = {}

    def save() -> tuple[Path, Path]:
        """Write the results so far (after every repetition, so a long run is never lost)."""
        med = report.medians(runs)
        data = {
            "meta": meta,
            "medians": med,
            "rows": report.rows(med),
            "targets": report.targets(med),
            "runs": runs,
        }
        return report.write(out_dir, data)

    def guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """One dtq measurement; a failure is recorded as that run's error, not the suite's end."""
        try:
            return fn()
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:2000]}

    def record(w: str, lib: str, res: dict[str, Any]) -> None:
        runs.setdefault(w, {}).setdefault(lib, []).append(res)
        brief = {k: v for k, v in res.items() if k.endswith(("_per_s", "_ms")) or k == "error"}
        say(f"{w} {lib}: {brief}")

    with BenchRedis() as srv, contextlib.ExitStack() as stack:
        meta |= {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": _machine(),
            "redis": srv.version(),
            "python": platform.python_version(),
            "reps": reps,
            "sizes": sz,
            "load_before": _load(),
            "peers": libs,
            "peers_note": peers_note,
            "worker_log_level": args.log_level,
        }
        say(f"redis-server {meta['redis']} on port {srv.port}; {meta['machine']}")
        b = DtqBench(srv, log_level=args.log_level)

        caps: dict[tuple[str, str], int] = {}
        for part in args.peer_n.split(","):
            lw, sep, num = part.partition("=")
            lib_name, sep2, work = lw.partition(":")
            if sep and sep2 and num.strip().isdigit():
                caps[(lib_name.strip(), work.strip().upper())] = int(num)
        meta["peer_n"] = {f"{k[0]}:{k[1]}": v for k, v in caps.items()}

        def peer(w: str, lib: str, key: str | None = None, **opts: Any) -> None:
            # A cap by the row's own key (rq:P=...) before the workload's (rq:A=...).
            cap = caps.get((lib, key or w), caps.get((lib, w)))
            if cap is not None:
                opts["n"] = min(int(opts.get("n") or cap), cap)
            srv.flush()
            row = f"{lib}:{opts['variant']}" if opts.get("variant") else lib
            record(key or w, row, peers.run(lib, w, srv.url, args.peer_timeout, **opts))

        def variants(w: str, **opts: Any) -> None:
            for lib, variant, vw in VARIANTS if args.variants else ():
                if lib in libs and vw == w:
                    peer(w, lib, variant=variant, **opts)

        scale: ScaleBench | None = None
        scale_error = ""
        if "S" in wanted:
            try:
                scale = stack.enter_context(ScaleBench(srv, log_level=args.log_level))
            except Exception as exc:
                scale_error = f"S not run: {type(exc).__name__}: {exc}"[:2000]
                say(scale_error)

        for rep in range(reps):
            say(f"--- repetition {rep + 1}/{reps}")
            if "G" in wanted:
                srv.flush()
                record(
                    "G",
                    "xadd_single",
                    {"tasks_per_s": round(ceiling.xadd_single(srv.url, sz["G"]), 1)},
                )
                record(
                    "G",
                    "asyncio",
                    {"tasks_per_s": round(ceiling.asyncio_per_task(srv.url, sz["G"]), 1)},
                )
                record(
                    "G",
                    "sync_batched",
                    {"tasks_per_s": round(ceiling.sync_batched(srv.url, sz["G"]), 1)},
                )
            if "A" in wanted:
                record("A", "dtq", guard(lambda: b.throughput(sz["A"])))
                # dtq-worker --processes 2 against the peers' own 2-process settings.
                record("A2", "dtq", guard(lambda: b.throughput(sz["A"], procs=2, pool=True)))
                for lib in libs:
                    peer("A", lib, n=sz["A"], concurrency=32, procs=1)
                    peer("A", lib, key="A2", n=sz["A"], concurrency=32, procs=2)
                variants("A", n=sz["A"], concurrency=32, procs=1)
                # BullMQ's "processing at concurrency 100": one process at 100.
                record("A100", "dtq", guard(lambda: b.throughput(sz["A"], concurrency=100)))
                for lib in libs:
                    if lib not in shapes.A100_SKIP:
                        peer("A", lib, key="A100", n=sz["A"], concurrency=100, procs=1)
            if "B" in wanted:
                record("B", "dtq", guard(lambda: b.enqueue_rate(sz["B"])))
                for lib in libs:
                    peer("B", lib, n=sz["B"])
            if "C" in wanted:
                record("C", "dtq", guard(lambda: b.pickup_latency(sz["C"])))
                for lib in libs:
                    peer("C", lib, n=sz["C"], interval_ms=5)
                variants("C", n=sz["C"], interval_ms=5)
            if "D" in wanted:
                record("D", "dtq", guard(lambda: b.io_bound(sz["D"])))
                for lib in libs:
                    peer("D", lib, n=sz["D"], concurrency=100, sleep_ms=10)
            if scale is not None:
                record("S", "cost", guard(lambda: scale.cost(sz["S"])))
                record("S", "cost cluster3", guard(lambda: scale.cost(sz["S"], cluster=True)))
                for row in ROWS:
                    record("S", row, guard(lambda: scale.row(row, sz["S"])))  # noqa: B023
            elif "S" in wanted:
                record("S", "cost", {"error": scale_error})
            if "P" in wanted:
                record("P", "dtq", guard(lambda: shapes.ten_workers(b, sz["P"])))
                for lib in libs:
                    procs, conc = shapes.PEER_P[lib]
                    peer("A", lib, key="P", n=sz["P"], concurrency=conc, procs=procs)
            if "M" in wanted:
                for row, res in shapes.burn_down_rows(srv, sz["M"], sz["C"], args.log_level):
                    record("M", row, res)
            if "T" in wanted:
                for row, grouped in fairness.ROWS:
                    fair = lambda: fairness.fairness(b, sz["T"], grouped=grouped)  # noqa: B023, E731
                    record("T", row, guard(fair))
            if "W" in wanted:
                srv.flush()
                record("W", "dtq", guard(lambda: flowcost.flow_cost(srv.url, sz["W"])))
                srv.flush()
            meta["load_after"] = _load()
            save()
        if "E" in wanted:
            say(f"--- E: backlog scaling (per repetition every size, {sz['E_runs']} runs each)")
            for rep in range(reps):
                for res in b.backlog(sz["E_sizes"], sz["E"], sz["E_runs"]):
                    record("E", f"dtq backlog={res['backlog']:,}", res | {"rep": rep})
        if "F" in wanted:
            say("--- F: resources")
            record("F", "dtq", guard(lambda: b.resources(sz["F"])))
        meta["load_after"] = _load()

    j, m = save()
    say(f"wrote {m} and {j}")
    print(m.read_text())
    return 0
