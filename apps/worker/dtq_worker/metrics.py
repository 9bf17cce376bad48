"""The worker's Prometheus metrics (names from CONTRACT.md). Labels are bounded: no task ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dtq.errors import ConfigError
from dtq_worker.hotmetrics import HotCounterFamily, HotHistogramFamily


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
        self.duration = HotHistogramFamily(
            "dtq_task_duration_seconds", "Run time of tasks", ["queue", "task"], r
        )
        self.wait = HotHistogramFamily(
            "dtq_task_wait_seconds", "Time from enqueue to first start", ["queue"], r
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
        self.heartbeat_age = Gauge(
            "dtq_worker_heartbeat_age_seconds", "Seconds since the last good heartbeat", registry=r
        )

    def serve(self, port: int) -> None:
        try:
            start_http_server(port, registry=self.registry)
        except OSError as exc:  # a busy or forbidden port is configuration, not a lost Redis
            raise ConfigError(
                f"DTQ_METRICS_PORT={port}: cannot listen: {exc.strerror or exc}"
            ) from None
