"""The benchmark suite (bench/dtq_bench): a tiny end-to-end run, and the report's arithmetic.

No timing is asserted: the point is that `make bench` / `dtq bench` works and writes its files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtq_bench import report
from dtq_bench.suite import main


def test_median_record_ignores_failed_runs_and_keeps_ranges() -> None:
    med = report.median_record(
        [{"tasks_per_s": 10.0, "x": "a"}, {"tasks_per_s": 30.0, "x": "b"}, {"error": "boom"},
         {"tasks_per_s": 20.0, "x": "c"}]
    )  # fmt: skip
    assert med["tasks_per_s"] == 20.0
    assert med["tasks_per_s_range"] == [10.0, 30.0]
    assert med["ok_runs"] == 3 and med["errors"] == ["boom"]
    assert med["x"] == "a"


def test_targets_compare_dtq_with_the_fastest_peer_and_the_ceiling() -> None:
    med = {
        "A": {"dtq": {"tasks_per_s": 9000.0, "worker_cpu_us_per_task": 80.0},
              "arq": {"tasks_per_s": 2000.0}, "dramatiq": {"tasks_per_s": 3500.0}},
        "A2": {"dtq": {"worker_cpu_us_per_task": 88.5}},
        "G": {"asyncio": {"tasks_per_s": 20000.0}, "xadd_single": {"tasks_per_s": 10000.0}},
        "B": {"dtq": {"single_per_s": 9500.0, "bulk_per_s": 60000.0},
              "rq": {"single_per_s": 3000.0, "bulk_per_s": 10000.0}},
        "C": {"dtq": {"p50_ms": 0.8, "p99_ms": 2.0}, "taskiq": {"p50_ms": 1.2, "p99_ms": 1.9}},
        "F": {"dtq": {"bytes_per_queued_task": 380.0}},
    }  # fmt: skip
    got = {t["id"]: t["met"] for t in report.targets(med)}
    assert got["A-peers"] is False  # 9000 < 3 x 3500
    assert got["A-peers-5x"] is None  # no steady rates given
    assert got["A-ceiling"] is False  # 45% of 20000
    assert got["A2-cpu"] is False  # 88.5 > 1.1 x 80
    assert got["B-bulk"] is True and got["B-single"] is True
    assert got["C-abs"] is False and got["C-peers"] is False  # p99 2.0 > 1.9
    assert got["C-p99"] is False
    assert got["F"] is True
    med["A"]["dtq"]["steady_tasks_per_s"] = 26000.0
    med["A"]["dramatiq"]["steady_tasks_per_s"] = 5000.0
    assert {t["id"]: t["met"] for t in report.targets(med)}["A-peers-5x"] is True  # 5.2x
    med["A"]["dramatiq"]["steady_tasks_per_s"] = 5300.0
    assert {t["id"]: t["met"] for t in report.targets(med)}["A-peers-5x"] is False  # 4.9x
    med["A2"]["dtq"]["worker_cpu_us_per_task"] = 87.9
    assert {t["id"]: t["met"] for t in report.targets(med)}["A2-cpu"] is True
    rows = report.rows(med)
    a_arq = next(r for r in rows if r["workload"] == "A" and r["lib"] == "arq")
    assert a_arq["ratio_dtq_per_lib"] == 4.5


def test_backlog_target_falls_back_to_total_rate_when_a_size_has_no_steady_rate() -> None:
    e = {
        "dtq backlog=1,000": {"backlog": 1000, "tasks_per_s": 10000.0,
                              "steady_tasks_per_s": 20000.0},
        "dtq backlog=1,000,000": {"backlog": 1000000, "tasks_per_s": 9500.0,
                                  "steady_tasks_per_s": 17000.0},
    }  # fmt: skip
    got = {t["id"]: t for t in report.targets({"E": e})}
    assert got["E"]["met"] is False  # steady: 17000 < 0.9 x 20000
    # A run that ended between two polls has no steady rate: compare the totals of every size.
    e["dtq backlog=1,000,000"]["steady_tasks_per_s"] = None
    got = {t["id"]: t for t in report.targets({"E": e})}
    assert got["E"]["met"] is True  # 9500 >= 0.9 x 10000
    assert "tasks_per_s" in got["E"]["target"]


def test_ten_ms_target_falls_back_to_the_whole_run_when_there_is_no_steady_window() -> None:
    # A --quick D that ends between two polls of the done counter (a loaded host) has no
    # steady rate; the target is still reported, from the whole run.
    d = {"dtq": {"tasks_per_s": 9000.0, "steady_tasks_per_s": None}}
    got = {t["id"]: t for t in report.targets({"D": d})}
    assert got["D"]["met"] is True and "whole run" in got["D"]["measured"]
    d["dtq"]["tasks_per_s"] = 8000.0
    assert {t["id"]: t for t in report.targets({"D": d})}["D"]["met"] is False


@pytest.mark.slow
def test_quick_suite_runs_every_workload_and_writes_results(tmp_path: Path) -> None:
    argv = [
        "--quick", "--peers", "none", "--out", str(tmp_path), "--reps", "1",
        "--n-a", "300", "--n-b", "200", "--n-c", "20", "--n-d", "300", "--n-e", "200",
        "--e-runs", "3", "--backlogs", "100,400", "--n-f", "500", "--n-g", "500",
        "--n-w", "50", "--workloads", "ABCDEFGW",
    ]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    med = data["medians"]
    assert set(med) == {"A", "A2", "A100", "B", "C", "D", "E", "F", "G", "W"}
    assert med["A"]["dtq"]["tasks_per_s"] > 0
    assert med["A2"]["dtq"]["procs"] == 2
    assert med["B"]["dtq"]["single_per_s"] > 0 and med["B"]["dtq"]["bulk_per_s"] > 0
    assert 0 < med["C"]["dtq"]["p50_ms"] <= med["C"]["dtq"]["p99_ms"]
    assert len(med["E"]) == 2
    e = med["E"]["dtq backlog=400"]
    # The kept run is the median of the three timed ones (by steady rate when every run has
    # one), and all three are listed.
    key = "steady_tasks_per_s"
    if None in e["runs_" + key][0]:
        key = "tasks_per_s"
    timed = e["runs_" + key][0]
    assert len(timed) == 3 and e[key] == sorted(timed)[1]
    f = med["F"]["dtq"]
    assert f["bytes_per_queued_task"] > 0 and f["commands_per_task"] > 1
    assert {"xadd_single", "asyncio", "sync_batched"} <= set(med["G"])
    assert {t["id"] for t in data["targets"]} >= {"A-ceiling", "B-single", "C-abs", "D", "E", "F"}
    md = (tmp_path / "results.md").read_text()
    assert "## Targets" in md and "not run (--peers none)" in md
