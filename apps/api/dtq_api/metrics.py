"""The fleet exporter: queue and worker gauges read from Redis at scrape time.

Labels are bounded: queue names and priority bands only (no task ids, arguments or error text);
past ``MAX_QUEUES`` queues the rest are left out and counted in ``dtq_exporter_queues_dropped``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dtq.admin import Admin, QueueInfo, WorkerInfo

MAX_QUEUES = 500


# Per queue: name, help, the reading.
QUEUE_GAUGES: tuple[tuple[str, str, Callable[[QueueInfo], float]], ...] = (
    ("dtq_queue_scheduled", "Delayed tasks and retries waiting for their time",
     lambda q: q.scheduled),
    ("dtq_queue_running", "Tasks taken by a worker and not finished", lambda q: q.running),
    ("dtq_dlq_depth", "Failed tasks in the dead-letter queue", lambda q: q.dlq),
    ("dtq_queue_paused", "1 while the queue is paused", lambda q: 1 if q.paused else 0),
    ("dtq_queue_oldest_waiting_seconds", "Age of the oldest waiting task (0 when none waits)",
     lambda q: q.oldest_waiting_age_s or 0.0),
    ("dtq_queue_active_groups", "Fair groups with waiting or running tasks (a partitioned "
     "queue: summed over its partitions)", lambda q: q.active_groups),
)  # fmt: skip


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
        for q in self.queues:
            for p, n in q.depth.items():
                depth.add_metric([q.name, str(p)], n)
        yield depth
        for name, doc, read in QUEUE_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["queue"])
            for q in self.queues:
                gauge.add_metric([q.name], read(q))
            yield gauge
        live = [w for w in self.workers if w.live]
        for name, doc, value in (
            ("dtq_workers_live", "Workers with a recent heartbeat", len(live)),
            ("dtq_workers_stale", "Known workers whose heartbeat is older than 3 intervals",
             len(self.workers) - len(live)),
            ("dtq_workers_inflight", "Tasks in flight on live workers, from their heartbeats",
             sum(w.active_tasks for w in live)),
            ("dtq_exporter_queues_dropped",
             f"Queues left out of this scrape (more than {MAX_QUEUES})", self.dropped),
            ("dtq_exporter_scrape_seconds", "Time spent reading Redis for this scrape", self.took),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, doc, value=value)


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
