"""The fleet exporter: queue and worker gauges read from Redis at scrape time.

Labels are bounded: queue names and priority bands only (no task ids, arguments or error text);
past ``MAX_QUEUES`` queues the rest are left out and counted in ``dtq_exporter_queues_dropped``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dtq.admin import Admin, QueueInfo, WorkerInfo

MAX_QUEUES = 500


class Snapshot(Collector):
    """One scrape's worth of readings, turned into metric families."""

    def __init__(
        self, queues: list[QueueInfo], workers: list[WorkerInfo], dropped: int, took: float
    ) -> None:
        self.queues, self.workers, self.dropped, self.took = queues, workers, dropped, took

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "dtq_queue_depth",
            "Tasks waiting to be taken, per queue and priority band",
            labels=["queue", "priority"],
        )
        sched = GaugeMetricFamily(
            "dtq_queue_scheduled",
            "Delayed tasks and retries waiting for their time",
            labels=["queue"],
        )
        running = GaugeMetricFamily(
            "dtq_queue_running", "Tasks taken by a worker and not finished", labels=["queue"]
        )
        dlq = GaugeMetricFamily(
            "dtq_dlq_depth", "Failed tasks in the dead-letter queue", labels=["queue"]
        )
        paused = GaugeMetricFamily(
            "dtq_queue_paused", "1 while the queue is paused", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "dtq_queue_oldest_waiting_seconds",
            "Age of the oldest waiting task (0 when none waits)",
            labels=["queue"],
        )
        groups = GaugeMetricFamily(
            "dtq_queue_active_groups",
            "Fair groups with waiting or running tasks (a partitioned queue: summed over its "
            "partitions)",
            labels=["queue"],
        )
        for q in self.queues:
            for p, n in q.depth.items():
                depth.add_metric([q.name, str(p)], n)
            sched.add_metric([q.name], q.scheduled)
            running.add_metric([q.name], q.running)
            dlq.add_metric([q.name], q.dlq)
            paused.add_metric([q.name], 1 if q.paused else 0)
            oldest.add_metric([q.name], q.oldest_waiting_age_s or 0.0)
            groups.add_metric([q.name], q.active_groups)
        yield from (depth, sched, running, dlq, paused, oldest, groups)
        live = sum(1 for w in self.workers if w.live)
        yield GaugeMetricFamily("dtq_workers_live", "Workers with a recent heartbeat", value=live)
        yield GaugeMetricFamily(
            "dtq_workers_stale",
            "Known workers whose heartbeat is older than 3 intervals",
            value=len(self.workers) - live,
        )
        yield GaugeMetricFamily(
            "dtq_workers_inflight",
            "Tasks in flight on live workers, from their heartbeats",
            value=sum(w.active_tasks for w in self.workers if w.live),
        )
        yield GaugeMetricFamily(
            "dtq_exporter_queues_dropped",
            f"Queues left out of this scrape (more than {MAX_QUEUES})",
            value=self.dropped,
        )
        yield GaugeMetricFamily(
            "dtq_exporter_scrape_seconds",
            "Time spent reading Redis for this scrape",
            value=self.took,
        )


async def render(admin: Admin) -> bytes:
    """Read the fleet state and render it in the Prometheus text format."""
    t0 = time.perf_counter()
    names = await admin.queue_names()
    dropped = max(0, len(names) - MAX_QUEUES)
    queues = await admin.queue_infos(names[:MAX_QUEUES])
    workers = await admin.list_workers()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot(queues, workers, dropped, time.perf_counter() - t0))
    return generate_latest(registry)
