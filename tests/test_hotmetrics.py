"""The worker's lock-free per-run metrics export exactly what prometheus_client's would."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

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
