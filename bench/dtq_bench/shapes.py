"""The shapes other benchmarks publish, run in this suite (docs/performance.md).

- **M**, burn-down: ``n`` (1,000,000) no-op tasks enqueued in bulk, then one worker process
  drains them; on the suite's redis-server (no persistence) and on a second one started with
  ``--appendonly yes --appendfsync everysec``. Each row also measures pickup latency (workload
  C's 1,000 tasks 5 ms apart) on its server, the backlog drained.
- **P**, "20,000 no-op jobs, 10 workers" (the comparison Python users cite: each library's
  10 worker processes drain 20,000 queued no-op jobs, timed from the workers' start): dtq as 10
  ``python -m dtq_worker`` processes at the default concurrency (16); each peer as 10 worker
  processes at its own default concurrency (:data:`PEER_P`); rq as ``rq worker-pool -n 10``.
- BullMQ's shapes are rows of A and B: "processing at concurrency 100" is A100 (one process at
  concurrency 100), "single add/s" and "bulk add/s" are B's two rows.
"""

from __future__ import annotations

from typing import Any

from dtq_bench.server import BenchRedis
from dtq_bench.workloads import DtqBench, Result

AOF_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec")
# P: dtq's default DTQ_WORKER_CONCURRENCY.
DTQ_P_CONCURRENCY = 16
# P for each peer: (worker processes, concurrency per process), the library's own default
# concurrency where it has one: dramatiq --threads 8, taskiq --max-async-tasks 100, arq
# max_jobs 10, saq concurrency 10, streaq concurrency 16, celery -c = CPU count (its threads
# pool here: 2 on the 2-core host; prefork's default is the same count). rq's worker runs
# one job at a time: "10 workers" is ``rq worker-pool -n 10`` (the runner's concurrency is
# rq's pool size).
PEER_P: dict[str, tuple[int, int]] = {
    "dramatiq": (10, 8),
    "taskiq": (10, 100),
    "arq": (10, 10),
    "saq": (10, 10),
    "streaq": (10, 16),
    "celery": (10, 2),
    "rq": (1, 10),
}
# A100: rq has no concurrency within a process (100 would be 100 forked processes).
A100_SKIP = ("rq",)


def aof_bytes(srv: BenchRedis) -> int:
    """Bytes of the append-only file so far (0 with persistence off)."""
    with srv.client() as c:
        info = c.info("persistence")
    return int(info.get("aof_current_size") or 0) if info.get("aof_enabled") else 0


def burn_down(srv: BenchRedis, n: int, n_pickup: int, log_level: str) -> Result:
    """M on ``srv``: ``n`` tasks prefilled in bulk, one worker process (concurrency 32) times
    them from its start to the last completion; then pickup latency with the queue empty."""
    b = DtqBench(srv, log_level=log_level, timeout=max(600.0, n / 500))
    res = b.throughput(n)
    # Before the pickup run, whose flush resets the stats (aof_rewrites).
    aof = aof_bytes(srv)
    with srv.client() as c:
        persistence = c.info("persistence")
    pick = b.pickup_latency(n_pickup)
    res |= {
        "aof": "everysec" if persistence.get("aof_enabled") else "off",
        "aof_bytes_per_task": round(aof / n, 1) if aof else None,
        "aof_rewrites": int(persistence.get("aof_rewrites") or 0),
        "pickup_n": n_pickup,
        "p50_ms": pick["p50_ms"],
        "p95_ms": pick["p95_ms"],
        "p99_ms": pick["p99_ms"],
    }
    return res


def burn_down_rows(
    srv: BenchRedis, n: int, n_pickup: int, log_level: str
) -> list[tuple[str, dict[str, Any]]]:
    """Both rows of M, without persistence first, then on a private AOF server of their own."""
    out: list[tuple[str, dict[str, Any]]] = []
    for row, args in (("dtq", ()), ("dtq aof=everysec", AOF_ARGS)):
        try:
            if args:
                with BenchRedis(extra_args=args) as aof_srv:
                    out.append((row, burn_down(aof_srv, n, n_pickup, log_level)))
            else:
                srv.flush()
                out.append((row, burn_down(srv, n, n_pickup, log_level)))
                srv.flush()
        except Exception as exc:
            out.append((row, {"error": f"{type(exc).__name__}: {exc}"[:2000]}))
    return out


def ten_workers(b: DtqBench, n: int) -> Result:
    """P for dtq: 10 separate worker processes at the default concurrency."""
    return b.throughput(n, procs=10, concurrency=DTQ_P_CONCURRENCY)
