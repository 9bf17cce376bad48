"""Workloads M (burn-down, with and without AOF), P (10 worker processes) and A100 (one process
at concurrency 100) of the bench suite (bench/dtq_bench/shapes.py), at tiny sizes. No timing is
asserted: each row must be measured (not an error), on the server and setting it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtq_bench import report, shapes
from dtq_bench.peers import LIBS
from dtq_bench.suite import main


@pytest.mark.slow
def test_burn_down_ten_workers_and_concurrency_100_run_and_are_reported(tmp_path: Path) -> None:
    argv = [
        "--peers", "none", "--out", str(tmp_path), "--reps", "1", "--workloads", "AMP",
        "--n-a", "300", "--n-m", "2000", "--n-p", "400", "--n-c", "20",
    ]  # fmt: skip
    assert main(argv) == 0
    med = json.loads((tmp_path / "results.json").read_text())["medians"]
    assert {"A", "A2", "A100", "M", "P"} <= set(med)
    for w, row in (("A100", "dtq"), ("P", "dtq"), ("M", "dtq"), ("M", "dtq aof=everysec")):
        assert "errors" not in med[w][row], (w, row, med[w][row])
    assert med["A100"]["dtq"]["concurrency"] == 100
    p = med["P"]["dtq"]
    assert p["procs"] == 10 and p["concurrency"] == shapes.DTQ_P_CONCURRENCY and p["n"] == 400
    plain, aof = med["M"]["dtq"], med["M"]["dtq aof=everysec"]
    # The AOF row ran on a server with the append-only file on; the other without.
    assert plain["aof"] == "off" and plain["aof_bytes_per_task"] is None
    assert aof["aof"] == "everysec" and aof["aof_bytes_per_task"] > 0
    for rec in (plain, aof):
        assert rec["n"] == 2000 and rec["tasks_per_s"] > 0
        assert rec["worker_cpu_us_per_task"] > 0 and rec["redis_cpu_us_per_task"] > 0
        assert rec["pickup_n"] == 20 and 0 < rec["p50_ms"] <= rec["p99_ms"]
    md = (tmp_path / "results.md").read_text()
    assert "## M: burn-down of 2,000 queued no-op tasks" in md
    assert "## A100:" in md and "## P:" in md


def test_every_peer_has_a_ten_worker_setting() -> None:
    assert set(shapes.PEER_P) == set(LIBS)
    # rq runs one job per process: its 10 workers are one worker-pool of 10.
    assert shapes.PEER_P["rq"] == (1, 10)
    assert all(procs == 10 for lib, (procs, _) in shapes.PEER_P.items() if lib != "rq")


def test_burn_down_table_lists_both_servers_and_an_errored_row() -> None:
    m = {
        "dtq": {"n": 1000000, "tasks_per_s": 20000.0, "worker_cpu_us_per_task": 40.0,
                "redis_cpu_us_per_task": 25.0, "p50_ms": 0.4, "p99_ms": 0.9},
        "dtq aof=everysec": {"errors": ["TimeoutError: only 5/10 tasks completed"]},
    }  # fmt: skip
    text = "\n".join(report._burn_down(m))
    assert "1,000,000 queued no-op tasks" in text
    assert "| dtq | 20,000 | - | 40.00 | 25.00 | 0.40 | 0.90 | - |" in text
    assert "| dtq aof=everysec | error: TimeoutError" in text
