"""``dtq-worker APP --processes N``: a parent supervising N real worker processes, against a real
redis-server. Children are found through /proc (the parent's children) and the parent's log
(which pid each process got: a forked child shows the parent's command line).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dtq import Client
from dtq.settings import Settings
from dtq.store.keys import Keys
from dtq_worker.metrics import WorkerMetrics
from dtq_worker.poolhttp import Merged, child_word
from tests.conftest import ROOT, body_starts, make_settings, wait_until, worker_env
from tests.redis_server import RedisServer, free_port

APP = "tests.apps.basic:app"


STARTED = re.compile(r"process \d+ started \(([^)]*)\): pid (\d+), worker id (\S+)")


def children(w: Any) -> dict[str, int]:
    """The pool's live worker processes: worker id -> pid (from the parent's log line for each
    start, the latest one winning)."""
    pid = w.proc.pid
    try:
        kids = set(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return {}
    return {wid: int(kid) for _, kid, wid in STARTED.findall(w.output()) if kid in kids}


def starts(w: Any) -> list[tuple[str, str]]:
    """(how, worker id) of each process start the parent logged, in order."""
    return [(how, wid) for how, _, wid in STARTED.findall(w.output())]


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5.0).status_code
    except httpx.HTTPError:
        return None


def word(url: str) -> str | None:
    try:
        return str(httpx.get(url, timeout=5.0).json()["status"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def total(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in found.items() if n == name)


def pool_settings(server: RedisServer, prefix: str, **kw: Any) -> Settings:
    return make_settings(server.url, prefix, worker_concurrency=2, **kw)


def start_pool(
    spawn_worker: Any, settings: Settings, wid: str, n: int = 2, **env: str
) -> tuple[Any, str]:
    """A parent with ``n`` processes and a metrics port, once /readyz says all are ready."""
    port = free_port()
    w = spawn_worker(APP, settings, "--processes", str(n), "--worker-id", wid,
                     "--concurrency", str(settings.worker_concurrency),
                     DTQ_METRICS_PORT=str(port), **env)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: word(base + "/readyz") == "ok", timeout=60, interval=0.1)
    assert sorted(children(w)) == [f"{wid}-{i}" for i in range(n)]
    return w, base


@pytest.mark.slow
def test_two_processes_both_take_tasks_and_one_metrics_port_sums_them(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    w, base = start_pool(spawn_worker, settings, "pw")
    r = redis_server.client()
    with Client(settings=settings) as c:
        # Two slots per process and half a second per body: one process cannot hold them all.
        hs = [c.enqueue("record", [f"t{i}", 0.5]) for i in range(8)]
        assert [c.result(h.id, timeout=60) for h in hs] == [f"t{i}" for i in range(8)]
    starts = body_starts(r, prefix)
    assert len(starts) == 8
    assert {worker for _, _, worker in starts} == {"pw-0", "pw-1"}
    found = samples(base + "/metrics")
    by_worker = {
        dict(labels)["worker_id"]: v
        for (name, labels), v in found.items()
        if name == "dtq_worker_tasks_total" and dict(labels)["outcome"] == "succeeded"
    }
    assert set(by_worker) == {"pw-0", "pw-1"}
    assert sum(by_worker.values()) == 8
    for worker in ("pw-0", "pw-1"):  # each child's share is what its records say
        assert by_worker[worker] == sum(1 for s in starts if s[2] == worker)
    # Histograms without a worker label add up across the children (the hot metrics too).
    key = ("dtq_task_duration_seconds_count", (("queue", "default"), ("task", "record")))
    assert found[key] == 8
    assert found[("dtq_worker_processes", ())] == 2
    assert status(base + "/healthz") == 200
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0


@pytest.mark.slow
def test_a_killed_process_is_restarted_and_its_run_reclaimed(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    w, base = start_pool(spawn_worker, settings, "pk")
    r = redis_server.client()
    with Client(settings=settings) as c:
        warm = [c.enqueue("record", ["warm"]) for _ in range(6)]
        for h in warm:
            c.result(h.id, timeout=60)

        # A result is in Redis a moment before its process counts it (the count follows the
        # outcome write), so the scrape waits for the count rather than racing it.
        def tasks_total() -> float:
            return total(samples(base + "/metrics"), "dtq_worker_tasks_total")

        wait_until(lambda: tasks_total() >= 6, timeout=30, interval=0.05)
        before = tasks_total()
        assert before == 6
        hs = [c.enqueue("record", [f"long{i}", 3.0]) for i in range(4)]
        wait_until(lambda: {s[2] for s in body_starts(r, prefix) if s[0] in
                            {h.id for h in hs}} == {"pk-0", "pk-1"}, timeout=60)  # fmt: skip
        victim = children(w)["pk-0"]
        killed_runs = {s[0] for s in body_starts(r, prefix) if s[2] == "pk-0" and s[0] in
                       {h.id for h in hs}}  # fmt: skip
        os.kill(victim, signal.SIGKILL)
        # Restarted under the same id, as a new process.
        wait_until(lambda: children(w).get("pk-0", victim) != victim, timeout=60)
        wait_until(lambda: word(base + "/readyz") == "ok", timeout=60, interval=0.1)
        # The killed process's runs are reclaimed and finish.
        assert [c.result(h.id, timeout=60) for h in hs] == [f"long{i}" for i in range(4)]
        for tid in killed_runs:
            assert [a for t, a, _ in body_starts(r, prefix) if t == tid] == [1, 2]
        # The summed counter did not go down when its process died (a rate() would read a
        # reset): what the dead one had reported is kept.
        wait_until(lambda: tasks_total() >= before + 4, timeout=30, interval=0.05)
        assert tasks_total() == before + 4
    found = samples(base + "/metrics")
    assert found[("dtq_worker_process_restarts_total", ())] == 1
    assert w.proc.poll() is None
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0


@pytest.mark.slow
@pytest.mark.parametrize("metrics_port", [False, True], ids=["no-port", "port"])
def test_children_are_forks_of_the_parent_and_do_not_import_the_app_again(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path, metrics_port: bool
) -> None:
    """The parent imported the app before its children start; they are forks of it, so the
    app's module is imported once (start-up is paid once, not per process). A restart is a fork
    too, unless the parent serves DTQ_METRICS_PORT: that thread makes it start a fresh
    interpreter (poolfork.py), which imports the app itself."""
    imports = tmp_path / "imports"
    env = {"DTQ_TEST_IMPORTS": str(imports)}
    if metrics_port:
        env["DTQ_METRICS_PORT"] = str(free_port())
    settings = pool_settings(redis_server, prefix)
    w = spawn_worker("tests.apps.counted:app", settings, "--processes", "2", "--worker-id", "pf",
                     "--concurrency", "2", **env)  # fmt: skip
    r = redis_server.client()

    def started(wid: str) -> int:
        return w.output().count(f"worker {wid} started")

    def run_on_both(tag: str) -> None:
        """Tasks both processes take (two slots each, half a second per body: one process
        cannot hold them all)."""
        with Client(settings=settings) as c:
            hs = [c.enqueue("record", [f"{tag}{i}", 0.5]) for i in range(8)]
            assert [c.result(h.id, timeout=60) for h in hs] == [f"{tag}{i}" for i in range(8)]
        ids = {h.id for h in hs}
        assert {wid for t, _, wid in body_starts(r, prefix) if t in ids} == {"pf-0", "pf-1"}

    wait_until(lambda: started("pf-0") == started("pf-1") == 1, timeout=60)
    run_on_both("a")
    assert imports.read_text().split() == [str(w.proc.pid)]
    assert starts(w) == [("fork", "pf-0"), ("fork", "pf-1")]
    victim = children(w)["pf-0"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: children(w).get("pf-0", victim) != victim, timeout=60)
    wait_until(lambda: started("pf-0") == 2, timeout=60)  # its imports come before
    run_on_both("b")
    restarted = children(w)["pf-0"]
    if metrics_port:
        assert starts(w)[-1] == ("fresh interpreter", "pf-0")
        assert imports.read_text().split() == [str(w.proc.pid), str(restarted)]
    else:
        assert starts(w)[-1] == ("fork", "pf-0")
        assert imports.read_text().split() == [str(w.proc.pid)]
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0
    out = w.output()
    assert "worker pf-0 stopped" in out and "worker pf-1 stopped" in out  # both drained


@pytest.mark.slow
def test_processes_that_keep_dying_make_the_parent_give_up_with_exit_1(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    w, _ = start_pool(spawn_worker, settings, "pd")
    killed: set[int] = set()
    deadline = time.monotonic() + 120
    while w.proc.poll() is None:  # an OOM killer that takes process 0 each time it is back
        assert time.monotonic() < deadline, w.output()
        pid = children(w).get("pd-0")
        if pid is not None and pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.02)
    assert w.wait(10) == 1
    assert len(killed) == 5  # the first process and 4 restarts; the 5th death gives up
    out = w.output()
    assert "giving up" in out
    # The other process was stopped, not abandoned: it drained and said so.
    assert "worker pd-1 stopped" in out


@pytest.mark.slow
def test_sigterm_drains_every_process_then_exits_0(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    w, base = start_pool(spawn_worker, settings, "ps")
    r = redis_server.client()
    with Client(settings=settings) as c:
        hs = [c.enqueue("record", [f"d{i}", 2.0]) for i in range(4)]
        wait_until(lambda: {s[2] for s in body_starts(r, prefix)} == {"ps-0", "ps-1"},
                   timeout=60)  # fmt: skip
        running = [h for h in hs if c.get(h.id).status == "running"]
        assert running
        w.signal(signal.SIGTERM)
        wait_until(lambda: word(base + "/readyz") == "draining", timeout=10, interval=0.05)
        assert w.wait(60) == 0
        for h in running:  # what ran when the stop came finished, once
            assert c.get(h.id).status == "succeeded"
            assert [a for t, a, _ in body_starts(r, prefix) if t == h.id] == [1]
    assert "stopping 2 processes (drain)" in w.output()


@pytest.mark.slow
def test_parent_readyz_is_503_while_redis_is_down(
    fresh_redis: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    # A heartbeat TTL far above the outage: the children stay up, not ready.
    settings = pool_settings(fresh_redis, prefix, visibility_timeout_s=120, heartbeat_ttl_s=60)
    w, base = start_pool(spawn_worker, settings, "pr", DTQ_HEARTBEAT_TTL_S="60",
                         DTQ_VISIBILITY_TIMEOUT_S="120")  # fmt: skip
    fresh_redis.stop()
    wait_until(lambda: status(base + "/readyz") == 503, timeout=30, interval=0.1)
    assert (word(base + "/readyz") or "").endswith("redis unreachable")
    assert status(base + "/healthz") == 200  # liveness: a Redis outage is no reason to restart
    assert w.proc.poll() is None
    fresh_redis.start()
    wait_until(lambda: status(base + "/readyz") == 200, timeout=30, interval=0.1)
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0


def run_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtq_worker", *args],
        cwd=ROOT,
        env=worker_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_app_is_refused_once_by_the_parent_with_exit_2(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = pool_settings(redis_server, prefix)
    done = run_cli(settings, "tests.apps.no_such_module:app", "--processes", "3")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtq-worker: "), done.stderr
    assert "started" not in done.stdout + done.stderr
    long_id = "w" * 63
    done = run_cli(settings, APP, "--processes", "12", "--worker-id", long_id)
    assert done.returncode == 2
    assert "too long for 12 processes" in done.stderr
    with socket.socket() as taken:  # the parent's port is in use: refused before any child
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = run_cli(settings, APP, "--processes", "2", DTQ_METRICS_PORT=port)
    assert done.returncode == 2
    assert f"DTQ_METRICS_PORT={port}: cannot listen" in done.stderr
    assert "process 0 started" not in done.stdout + done.stderr


@pytest.mark.slow
def test_one_process_runs_without_a_parent(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    port = free_port()
    w = spawn_worker(APP, settings, "--processes", "1", "--worker-id", "p1",
                     DTQ_METRICS_PORT=str(port))  # fmt: skip
    wait_until(lambda: word(f"http://127.0.0.1:{port}/readyz") == "ok", timeout=60)
    assert Path(f"/proc/{w.proc.pid}/task/{w.proc.pid}/children").read_text().split() == []
    with Client(settings=settings) as c:
        h = c.enqueue("record", ["solo"])
        assert c.result(h.id, timeout=30) == "solo"
    assert body_starts(redis_server.client(), prefix)[0][2] == "p1"
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0


def test_merged_metrics_add_counters_and_histograms_and_keep_the_worst_gauge() -> None:
    a, b = WorkerMetrics("a"), WorkerMetrics("b")
    for m, runs in ((a, 3), (b, 5)):
        for _ in range(runs):
            m.tasks.labels(m.worker_id, "q", "t", "succeeded").inc()
            m.duration.labels("q", "t").observe(0.02)
        m.reclaimed.inc(runs)
    a.heartbeat_age.set(1.0)
    b.heartbeat_age.set(7.0)
    merged = Merged()
    for m in (a, b):
        merged.add_text(generate_latest(m.registry).decode())
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    class Out(Collector):
        def collect(self) -> Any:
            return merged.metrics()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Out())
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(reg).decode())
        for s in fam.samples
    }
    tasks = {k: v for k, v in found.items() if k[0] == "dtq_worker_tasks_total"}
    assert sorted(tasks.values()) == [3, 5]  # one series per worker id
    assert found[("dtq_task_duration_seconds_count", (("queue", "q"), ("task", "t")))] == 8
    bucket = (("le", "0.025"), ("queue", "q"), ("task", "t"))
    assert found[("dtq_task_duration_seconds_bucket", bucket)] == 8
    assert found[("dtq_tasks_reclaimed_total", ())] == 8
    assert found[("dtq_worker_heartbeat_age_seconds", ())] == 7.0
    # A dead child's counters, kept without its gauges, still add up.
    retired = Merged()
    retired.add_text(generate_latest(a.registry).decode(), gauges=False)
    assert "dtq_worker_heartbeat_age_seconds" not in retired.families
    again = Merged()
    again.add(retired)
    again.add_text(generate_latest(b.registry).decode())
    assert again.values["dtq_tasks_reclaimed"][("dtq_tasks_reclaimed_total", ())] == 8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "body", "word"),
    [
        (200, '{"status": "ok"}', "ok"),
        (503, '{"status": "ok"}', "HTTP 503"),  # the status decides, whatever the body says
        (503, '{"status": "redis unreachable"}', "redis unreachable"),
        (200, "not json", "HTTP 200"),
        (0, "connection refused", "not answering (connection refused)"),
    ],
)
def test_a_childs_probe_is_ok_only_with_http_200_and_status_ok(
    status: int, body: str, word: str
) -> None:
    assert child_word(status, body) == word


def test_a_process_refusing_its_configuration_stops_the_pool_with_exit_2(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    # Found by each child at its start, not by the parent: a restart cannot mend it.
    redis_server.client().set(f"{prefix}:schema", "999")
    settings = pool_settings(redis_server, prefix)
    w = spawn_worker(APP, settings, "--processes", "2", "--worker-id", "pc")
    assert w.wait(60) == 2
    out = w.output()
    assert "exited 2 (bad configuration)" in out
    assert "restarting" not in out


@pytest.mark.slow
def test_a_second_sigterm_makes_every_process_skip_its_drain(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix, drain_timeout_s=60, hard_exit_s=60)
    w, _ = start_pool(spawn_worker, settings, "p2", DTQ_DRAIN_TIMEOUT_S="60",
                      DTQ_HARD_EXIT_S="60")  # fmt: skip
    r = redis_server.client()
    with Client(settings=settings) as c:
        hs = [c.enqueue("record", [f"s{i}", 30.0]) for i in range(4)]
        wait_until(lambda: {s[2] for s in body_starts(r, prefix)} == {"p2-0", "p2-1"},
                   timeout=60)  # fmt: skip
        w.signal(signal.SIGTERM)
        wait_until(lambda: w.output().count("draining (up to 60s)") == 2, timeout=30)
        w.signal(signal.SIGTERM)
        # Far sooner than the 30 s bodies or the 60 s drain: the second signal got through.
        assert w.wait(20) == 0
        out = w.output()
        assert out.count("skipping the drain") == 2, out
        # The interrupted runs were handed back, not lost: they wait to run again.
        assert all(c.get(h.id).status in ("queued", "running") for h in hs)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_killed_parent_takes_its_processes_down_and_its_port_dir_is_removed_later(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = pool_settings(redis_server, prefix)
    w, _ = start_pool(spawn_worker, settings, "pp")
    kids = list(children(w).values())
    tmp = Path(tempfile.gettempdir())
    (left,) = tmp.glob(f"dtq-pool-{w.proc.pid}-*")
    w.kill()
    # No orphans running tasks without a supervisor: the kernel tells each to stop (drain).
    wait_until(lambda: all(_gone(k) for k in kids), timeout=60)
    assert left.exists()  # nobody could clean up after a SIGKILL...
    w2, _ = start_pool(spawn_worker, settings, "pq")
    assert not left.exists()  # ...until the next parent starts
    w2.signal(signal.SIGTERM)
    assert w2.wait(60) == 0


@pytest.mark.slow
def test_redis_lost_for_good_ends_the_pool_with_exit_1(
    fresh_redis: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    # Heartbeat TTL 0.6 s: each child stops itself (exit 1) soon after Redis goes, and again
    # after each restart (it waits one TTL for Redis at its start).
    settings = pool_settings(fresh_redis, prefix)
    w, _ = start_pool(spawn_worker, settings, "pl")
    fresh_redis.stop()
    assert w.wait(120) == 1
    out = w.output()
    assert "giving up" in out
    assert "restarting in" in out


@pytest.mark.slow
def test_a_pool_restarted_after_its_parent_was_killed_waits_for_the_old_processes(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    """The parent SIGKILLed while its processes run tasks: they drain under their ids
    (PR_SET_PDEATHSIG). The same command started again waits for them instead of refusing the
    ids as a configuration error (it exited 2), then takes new tasks; no attempt starts twice."""
    settings = pool_settings(redis_server, prefix, drain_timeout_s=60)
    w, _ = start_pool(spawn_worker, settings, "pr", DTQ_DRAIN_TIMEOUT_S="60")
    old = list(children(w).values())
    r = redis_server.client()
    gate = f"{prefix}:test:gate"
    with Client(settings=settings) as c:
        olds = [c.enqueue("record_until", [f"old{i}", gate]) for i in range(4)]
        wait_until(lambda: len(body_starts(r, prefix)) == 4, timeout=60)
        w.kill()
        w2 = spawn_worker(APP, settings, "--processes", "2", "--worker-id", "pr",
                          "--concurrency", "2", DTQ_DRAIN_TIMEOUT_S="60")  # fmt: skip
        # Each new process finds its id held by the old one, still running its task: it waits.
        try:
            wait_until(lambda: w2.output().count("waiting up to") == 2 or w2.proc.poll()
                       is not None, timeout=60)  # fmt: skip
        except AssertionError:
            raise AssertionError(w.output() + "\n-----\n" + w2.output()) from None
        assert w2.proc.poll() is None, w2.output()
        r.set(gate, 1)  # the old runs end; their processes finish the drain and go
        assert [c.result(h.id, timeout=60) for h in olds] == [f"old{i}" for i in range(4)]
        wait_until(lambda: all(_gone(k) for k in old), timeout=60)
        news = [c.enqueue("record", [f"new{i}"]) for i in range(4)]
        assert [c.result(h.id, timeout=60) for h in news] == [f"new{i}" for i in range(4)]
    starts = body_starts(r, prefix)
    assert sorted((t, a) for t, a, _ in starts) == sorted((h.id, 1) for h in olds + news)
    assert {wid for t, _, wid in starts if t in {h.id for h in news}} <= {"pr-0", "pr-1"}
    wait_until(lambda: w2.output().count("is free now: starting") == 2, timeout=60)
    # The old processes drained: the kernel's repeated parent-death signal (one per thread of
    # the dead parent) did not count as a second SIGTERM, which skips the drain.
    assert w.output().count("SIGTERM: draining") == 2, w.output()
    assert "skipping the drain" not in w.output(), w.output()
    assert w2.proc.poll() is None, w2.output()
    w2.signal(signal.SIGTERM)
    assert w2.wait(60) == 0, w2.output()


def test_two_processes_sharing_a_backlog_complete_it_in_full_batches(
    fresh_redis: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    """Each process of a pool takes half the tasks, but from a backlog its batches stay full:
    a claim asks for its free slots and an outcome write carries up to half the concurrency
    (16 here) with the refill claim in the same script call. Counted in script calls per task
    (INFO commandstats), not in time: measured at 0.063 (one call per ~16 tasks) in workload
    A2 as in A; 1/8 leaves room for the start and the tail, where batches are partial."""
    n = 2000
    kw: dict[str, Any] = {"heartbeat_interval_s": 2.0, "visibility_timeout_s": 30.0}
    settings = make_settings(fresh_redis.url, prefix, worker_concurrency=32, **kw)
    r = fresh_redis.client()
    with Client(settings=settings) as c:
        for start in range(0, n, 500):
            c.enqueue_many([{"name": "noop", "args": []} for _ in range(start, start + 500)])
    streams = Keys(prefix).queue("default").streams
    assert sum(int(r.xlen(s)) for s in streams) == n
    r.config_resetstat()
    w = spawn_worker(APP, settings, "--processes", "2", "--concurrency", "32", "--prefetch", "16")
    # complete.lua deletes a task's entry when its run ends: the streams empty once all ran.
    wait_until(lambda: sum(int(r.xlen(s)) for s in streams) == 0, timeout=120, interval=0.05)
    stats = r.info("commandstats")
    calls = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0
    assert calls / n <= 1 / 8, f"{calls} script calls for {n} tasks"
