"""The worker's probes and operations metrics, on a real worker process and a real redis-server.

/healthz answers 200 while the process and its event loop answer (Kubernetes liveness);
/readyz answers 200 while Redis is reachable and heartbeats land (readiness). Both live on
DTQ_METRICS_PORT beside /metrics.
"""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dtq import Client
from dtq_worker.metrics import WorkerMetrics
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer, free_port


def status(url: str, timeout: float = 3.0) -> int | None:
    """HTTP status of GET url, or None when nothing answered in time."""
    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def probe(url: str) -> str | None:
    """The probe's own word (its JSON ``status``), or None when it did not give one."""
    try:
        body = httpx.get(url, timeout=3.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    return body.get("status") if isinstance(body, dict) else None


def start_worker(spawn_worker: Any, server: RedisServer, **env: str) -> tuple[Any, str, Any]:
    # A heartbeat TTL far above the test's outage, so the worker does not stop itself while
    # Redis is down: readiness must say "not ready" while the process stays alive.
    settings = make_settings(server.url, "health", heartbeat_interval_s=0.2,
                             visibility_timeout_s=120, heartbeat_ttl_s=60)  # fmt: skip
    port = free_port()
    w = spawn_worker("tests.apps.blocking:app", settings, "--worker-id", "w-health",
                     DTQ_METRICS_PORT=str(port), DTQ_HEARTBEAT_TTL_S="60", **env)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: probe(base + "/readyz") == "ok", timeout=30, interval=0.1)
    assert status(base + "/readyz") == 200
    assert probe(base + "/healthz") == "ok"
    return w, base, settings


@pytest.mark.slow
def test_worker_healthz_fails_while_the_process_is_frozen(
    fresh_redis: RedisServer, spawn_worker: Any
) -> None:
    w, base, _ = start_worker(spawn_worker, fresh_redis)
    assert status(base + "/healthz") == 200
    w.signal(signal.SIGSTOP)
    try:
        # The kernel still accepts the connection, but nobody answers it.
        assert status(base + "/healthz", timeout=2.0) != 200
    finally:
        w.signal(signal.SIGCONT)
    wait_until(lambda: status(base + "/healthz") == 200, timeout=30, interval=0.1)


@pytest.mark.slow
def test_worker_healthz_fails_while_a_task_blocks_the_event_loop(
    fresh_redis: RedisServer, spawn_worker: Any
) -> None:
    _, base, settings = start_worker(spawn_worker, fresh_redis)
    with Client(settings=settings) as c:
        h = c.enqueue("block_loop", [8.0])
        # The probe's own thread still answers (time.sleep frees the GIL): it must say 503.
        wait_until(lambda: status(base + "/healthz") == 503, timeout=30, interval=0.1)
        body = httpx.get(base + "/healthz", timeout=10).json()
        assert body["status"] == "event loop not answering"
        assert c.result(h.id, timeout=60) is None
    wait_until(lambda: status(base + "/healthz") == 200, timeout=30, interval=0.1)


@pytest.mark.slow
def test_worker_readyz_is_503_while_redis_is_down_and_recovers(
    fresh_redis: RedisServer, spawn_worker: Any
) -> None:
    w, base, _ = start_worker(spawn_worker, fresh_redis)
    fresh_redis.stop()
    wait_until(lambda: status(base + "/readyz") == 503, timeout=30, interval=0.1)
    assert httpx.get(base + "/readyz", timeout=10).json()["status"] == "redis unreachable"
    # Liveness is about the process: a Redis outage must not get the pod restarted.
    assert status(base + "/healthz") == 200
    assert w.proc.poll() is None
    age = scrape(base + "/metrics")[("dtq_worker_heartbeat_age_seconds", ())]
    assert age > 0
    fresh_redis.start()
    wait_until(lambda: status(base + "/readyz") == 200, timeout=30, interval=0.1)


@pytest.mark.slow
def test_worker_readyz_is_503_while_draining(fresh_redis: RedisServer, spawn_worker: Any) -> None:
    w, base, settings = start_worker(spawn_worker, fresh_redis)
    with Client(settings=settings) as c:
        h = c.enqueue("nap", [3.0])
        wait_until(lambda: c.get(h.id).status == "running", timeout=30)
        w.signal(signal.SIGTERM)
        wait_until(lambda: status(base + "/readyz") == 503, timeout=10, interval=0.05)
        assert httpx.get(base + "/readyz", timeout=10).json()["status"] == "draining"
        assert c.result(h.id, timeout=30) == 3.0
    assert w.wait(30) == 0


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


@pytest.mark.slow
def test_worker_error_counters_exist_at_zero_before_any_error(
    fresh_redis: RedisServer, spawn_worker: Any
) -> None:
    # rate() and alerts over a counter that has no series yet see nothing: the first error
    # of a loop must show as a step from 0, so each loop's series exists from the start.
    _, base, _ = start_worker(spawn_worker, fresh_redis)
    samples = scrape(base + "/metrics")
    for loop in ("poll", "heartbeat", "outcome", "reaper", "scheduler", "cancels"):
        assert samples[("dtq_worker_redis_errors_total", (("loop", loop),))] == 0
        assert samples[("dtq_worker_loop_restarts_total", (("loop", loop),))] == 0


def bucket_counts(metrics: WorkerMetrics, name: str) -> dict[float, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        float(s.labels["le"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name + "_bucket"
    }


def test_task_duration_and_wait_buckets_tell_minutes_from_hours() -> None:
    # With the default buckets (up to 10 s) a 120 s task reads as p95 = 10 s.
    m = WorkerMetrics("w")
    m.duration.labels("q", "t").observe(120.0)
    m.wait.labels("q").observe(5400.0)
    for name, seen in (("dtq_task_duration_seconds", 120.0), ("dtq_task_wait_seconds", 5400.0)):
        counts = bucket_counts(m, name)
        finite = sorted(b for b in counts if b != float("inf"))
        assert finite[0] <= 0.01, "sub-10 ms runs must stay distinguishable"
        assert finite[-1] >= 4 * 3600, "hours-long runs and waits need finite buckets"
        above = [b for b in finite if b >= seen]
        below = [b for b in finite if b < seen]
        # The observation lands in a finite bucket no more than twice its value...
        assert above and above[0] <= 2 * seen and counts[above[0]] == 1
        # ...and not in any bucket below it.
        assert all(counts[b] == 0 for b in below)
