"""Workload S of the bench suite (bench/dtq_bench/scale.py): Redis CPU per task, worker
processes and cluster shards, run in its quick form. No timing is asserted: the rows, the
projection and the targets must be there, each measured (not an error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtq_bench import scalereport
from dtq_bench.suite import main

pytestmark = pytest.mark.slow


def test_workload_s_reports_redis_cpu_per_task_processes_shards_and_a_projection(
    tmp_path: Path,
) -> None:
    argv = ["--quick", "--peers", "none", "--workloads", "S", "--n-s", "400",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    s = data["medians"]["S"]
    assert set(s) == {
        "cost", "cost cluster3", "server p1", "server p2", "cluster1 p2", "cluster3 p2"
    }  # fmt: skip
    for row, rec in s.items():
        assert "errors" not in rec, (row, rec)
    for cost in (s["cost"], s["cost cluster3"]):
        for how in ("single", "bulk"):
            assert cost[f"enqueue_{how}_redis_us"] > 0 and cost[f"run_after_{how}_redis_us"] > 0
            total = cost[f"enqueue_{how}_redis_us"] + cost[f"run_after_{how}_redis_us"]
            assert abs(cost[f"total_{how}_redis_us"] - total) < 0.02
        # Concurrent single enqueues went out coalesced: far fewer script calls than tasks.
        assert cost["enqueue_coalesced_redis_us"] > 0
        assert 0 < cost["coalesced_calls_per_task"] < 0.5
        # So did those from many threads on one blocking Client.
        assert cost["enqueue_threaded_redis_us"] > 0
        assert 0 < cost["threaded_calls_per_task"] < 0.5
        # The server's floor per request, measured beside them.
        assert cost["request_floor_redis_us"] > 0
    assert s["server p1"]["procs"] == 1 and s["server p1"]["pool"] is False
    assert s["server p2"]["procs"] == 2 and s["server p2"]["pool"] is True
    # One Redis CPU figure per node: the 3-shard cluster's queues sit one on each shard.
    # (the whole run's figures: a quick run under load may end before the window's mark)
    assert len(s["cluster1 p2"]["redis_cpu_us_per_task_by_node"]) == 1
    assert len(s["cluster3 p2"]["redis_cpu_us_per_task_by_node"]) == 3
    assert s["cluster3 p2"]["queues_per_node"] == "1/1/1"
    targets = {t["id"]: t for t in data["targets"]}
    assert {"S-cpu-single", "S-cpu-bulk", "S-cpu-coalesced", "S-cpu-threaded"} <= set(targets)
    assert all(targets[k]["met"] in (True, False) for k in ("S-cpu-single", "S-cpu-bulk"))
    md = (tmp_path / "results.md").read_text()
    assert "## S: scale (dtq)" in md
    assert "| single, one server |" in md and "| bulk, 3-master cluster |" in md
    assert "| single from 64 coroutines (one AsyncClient), one server |" in md
    assert "| single from 64 threads (one Client), 3-master cluster |" in md
    assert "The server's floor for one request:" in md
    assert "(one PING alone:" in targets["S-cpu-single"]["measured"]
    assert "| cluster of 3 masters, --processes 2 (3 queues, 1 per shard) |" in md
    assert "| 1,000,000 |" in md and "the first limit" in md


def test_projection_scales_shards_and_processes_with_the_rate() -> None:
    s = {
        "cost": {"enqueue_single_redis_us": 10.0, "enqueue_bulk_redis_us": 3.0,
                 "run_after_single_redis_us": 15.0, "enqueue_single_client_us": 14.0,
                 "enqueue_bulk_client_us": 7.0, "enqueue_single_net_bytes": 300.0,
                 "enqueue_bulk_net_bytes": 100.0, "run_after_single_net_bytes": 200.0},
        "cluster3 p2": {"window_redis_cpu_us_per_task": 25.0,
                        "window_worker_cpu_us_per_task": 70.0},
    }  # fmt: skip
    proj, method = scalereport.projection(s)
    by_rate = {p["rate"]: p for p in proj}
    # Redis 10 + 25 = 35 µs per task enqueued singly, at 70% of a core: 20,000 tasks/s a shard;
    # 3 + 25 = 28 µs in bulk: 25,000 tasks/s a shard.
    assert by_rate[10_000]["shards_single"] == 1 and by_rate[100_000]["shards_single"] == 5
    assert by_rate[1_000_000]["shards_single"] == 50 and by_rate[1_000_000]["shards_bulk"] == 40
    # Workers at 70 µs per task: 10,000 tasks/s per process; clients 14 and 7 µs.
    assert by_rate[100_000]["worker_processes"] == 10
    assert by_rate[1_000_000]["client_cores_single"] == 20
    assert by_rate[1_000_000]["client_cores_bulk"] == 10
    assert by_rate[1_000_000]["net_mb_s"] == 500.0
    assert "~20,000 tasks/s enqueued one by one and ~25,000 in bulk" in method
