"""The worker's lock-free per-run metrics (dtq_worker/hotmetrics.py) export exactly what
prometheus_client's would, and read back with its exposition parser."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dtq_worker.hotmetrics import HotCounterFamily, HotHistogramFamily


def _series(registry: CollectorRegistry) -> list[str]:
    """Exposition lines without comments and the _created series prometheus_client adds."""
    text = generate_latest(registry).decode()
    return sorted(
        ln for ln in text.splitlines() if ln and not ln.startswith("#") and "_created" not in ln
    )


def test_hot_histogram_and_counter_match_prometheus_client() -> None:
    rng = random.Random(5)
    values = [rng.choice([0.005, 0.01, 2.5, 10.0, 11.0, 0.0]) for _ in range(50)]
    values += [rng.uniform(0, 12) for _ in range(500)]  # bounds themselves included above
    ref, hot = CollectorRegistry(), CollectorRegistry()
    ref_h = Histogram("dtq_task_duration_seconds", "d", ["queue", "task"], registry=ref)
    hot_h = HotHistogramFamily("dtq_task_duration_seconds", "d", ["queue", "task"], hot)
    ref_c = Counter("dtq_worker_tasks_total", "t", ["outcome"], registry=ref)
    hot_c = HotCounterFamily("dtq_worker_tasks_total", "t", ["outcome"], hot)
    for i, v in enumerate(values):
        task = "a" if i % 3 else "b"
        ref_h.labels("q", task).observe(v)
        hot_h.labels("q", task).observe(v)
        outcome = "succeeded" if v < 6 else "failed"
        ref_c.labels(outcome).inc()
        hot_c.labels(outcome).inc()
    got, want = _series(hot), _series(ref)
    assert got == want
    assert any('le="+Inf"' in ln for ln in got)


def test_hot_families_read_back_with_prometheus_clients_parser() -> None:
    """The exposition text of the hot families, read by prometheus_client's own parser: one
    histogram series per label set with cumulative buckets ending in +Inf == count, the sum
    observed, and the counter's value."""
    reg = CollectorRegistry()
    h = HotHistogramFamily("dtq_task_wait_seconds", "w", ["queue"], reg, (0.1, 1.0, float("inf")))
    c = HotCounterFamily("dtq_worker_tasks_total", "t", ["outcome"], reg)
    for v in (0.05, 0.1, 0.5, 3.0):
        h.labels("q").observe(v)
    c.labels("succeeded").inc(3)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    buckets = {
        s.labels["le"]: s.value for s in fams["dtq_task_wait_seconds"].samples
        if s.name.endswith("_bucket")
    }  # fmt: skip
    assert buckets == {"0.1": 2.0, "1.0": 3.0, "+Inf": 4.0}
    rest = {s.name: s.value for s in fams["dtq_task_wait_seconds"].samples}
    assert rest["dtq_task_wait_seconds_count"] == 4.0
    assert rest["dtq_task_wait_seconds_sum"] == 3.65
    assert fams["dtq_worker_tasks"].type == "counter"
    assert [s.value for s in fams["dtq_worker_tasks"].samples] == [3.0]
