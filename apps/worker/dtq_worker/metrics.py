"""The worker's Prometheus metrics (listed in docs/operations.md). Labels are bounded: no task
ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dtq.store import transport
from dtq_worker.hotmetrics import HotCounterFamily, HotHistogramFamily

# Run and wait times span milliseconds to hours (the default buckets stop at 10 s).
_SHORT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TASK_TIME_BUCKETS = (*_SHORT, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0, float("inf"))

# The ``loop`` labels, whose series exist at 0 from the start (rate() sees the first error).
LOOPS = ("poll", "heartbeat", "outcome", "reaper", "scheduler", "cancels", "flows")


class WorkerMetrics:
    def __init__(self, worker_id: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.worker_id = worker_id
        self.inflight = Gauge(
            "dtq_worker_inflight", "Tasks running on this worker", ["worker_id"], registry=r
        ).labels(worker_id)
        # Updated by every run: lock-free (hotmetrics.py), same names, labels and buckets.
        self.tasks = HotCounterFamily(
            "dtq_worker_tasks_total",
            "Runs finished by this worker, by outcome",
            ["worker_id", "queue", "task", "outcome"],
            r,
        )
        times = TASK_TIME_BUCKETS
        self.duration = HotHistogramFamily(
            "dtq_task_duration_seconds", "Run time of tasks", ["queue", "task"], r, times
        )
        self.wait = HotHistogramFamily(
            "dtq_task_wait_seconds", "Time from enqueue to first start", ["queue"], r, times
        )
        self.reclaimed = Counter(
            "dtq_tasks_reclaimed_total", "Runs of lost workers put back by this reaper", registry=r
        )
        self.absorbed = Counter(
            "dtq_duplicates_absorbed_total", "Duplicate entries acknowledged, never run", registry=r
        )
        self.claims_lost = Counter(
            "dtq_claims_lost_total", "Runs this worker found reclaimed by another", registry=r
        )
        self.adopted = Counter(
            "dtq_runs_adopted_total",
            "Runs this worker claimed but whose claim reply was lost, found by recover.lua and "
            "run (or handed back, when stopping)",
            registry=r,
        )
        self.stale_writes = Counter(
            "dtq_stale_writes_total", "Outcome writes rejected by the fence", registry=r
        )
        self.redis_errors = Counter(
            "dtq_worker_redis_errors_total", "Redis errors seen, by loop", ["loop"], registry=r
        )
        self.loop_restarts = Counter(
            "dtq_worker_loop_restarts_total", "Supervised loop restarts", ["loop"], registry=r
        )
        self.claim_latency = Histogram(
            "dtq_claim_seconds",
            "Round-trip time of one claim call of the poll loop (claims made by outcome writes "
            "ride on those and are not timed)",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
        )
        for loop in LOOPS:
            self.redis_errors.labels(loop)
            self.loop_restarts.labels(loop)
        self.fast_lane = Gauge(
            "dtq_fast_lane_enabled",
            "1 while script calls take dtq's fast lane (dtq/store/transport.py); 0 on redis-py's "
            "usual path (DTQ_FAST_LANE=0, or a redis-py without what the lane needs)",
            registry=r,
        )
        self.fast_lane.set_function(lambda: 1.0 if transport.in_use() else 0.0)
        # Read at scrape time (heartbeat.py points it at its clock): it grows while a beat hangs.
        self.heartbeat_age = Gauge(
            "dtq_worker_heartbeat_age_seconds", "Seconds since the last good heartbeat", registry=r
        )
