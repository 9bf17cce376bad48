"""Workload T of the bench suite (bench/dtq_bench/fairness.py): a small run of both rows, and the
arithmetic of its figures on made-up stamps. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtq_bench import fairness
from dtq_bench.suite import main


@pytest.mark.slow
@pytest.mark.parametrize("poll_s", [None, 0.08], ids=["default-poll", "slow-poll"])
def test_fairness_runs_both_rows_and_every_new_task_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, poll_s: float | None
) -> None:
    # A slow poll (a loaded host) sees the worker pass both marks of the big group's alone rate
    # between two samples: the rate must still come from two samples, not be left out.
    if poll_s is not None:
        monkeypatch.setattr(fairness, "POLL_S", poll_s)
    argv = ["--peers", "none", "--out", str(tmp_path), "--reps", "1", "--workloads", "T"]
    backlog = 1500 if poll_s is None else 6000  # (not all done within one slow poll)
    assert main([*argv, "--n-t", str(backlog)]) == 0
    med = json.loads((tmp_path / "results.json").read_text())["medians"]["T"]
    assert set(med) == {"dtq groups", "dtq no groups"}
    for row, grouped in fairness.ROWS:
        rec = med[row]
        assert "errors" not in rec, rec
        assert rec["grouped"] is grouped and rec["backlog"] == backlog
        assert rec["setting"].startswith("1 process x concurrency 16, prefetch 0")
        # Every new task was stamped once, inside the windows from the first arrival.
        (windows,) = rec["windows_t_big_new"]  # one run
        assert sum(w[2] for w in windows) == fairness.GROUPS * fairness.PER_GROUP
        assert 0 <= rec["first_start_p50_ms"] <= rec["first_start_p99_ms"]
        assert rec["first_start_p99_ms"] <= rec["first_start_max_ms"]
        assert 0 <= rec["big_share_while_new_wait"] < 1 and rec["big_alone_per_s"] > 0
    md = (tmp_path / "results.md").read_text()
    assert f"## T: fair groups, a backlog of {backlog:,} in one group, then 100 new groups" in md
    assert "| dtq groups |" in md and "| dtq no groups |" in md


def test_summary_reads_first_starts_shares_and_windows_from_the_stamps() -> None:
    arrived = {"a": 100.0, "b": 100.05}
    lines = ["a 100.0 100.01", "a 100.0 100.12", "b 100.05 100.33", "b 100.05 100.06"]
    # The big group's done counter: 0 at the first arrival, 30 by 100.1, 40 by 100.3.
    samples = [(99.9, 0), (100.0, 0), (100.1, 30), (100.2, 35), (100.3, 40), (100.4, 45)]
    s = fairness.summary(arrived, lines, samples, 0.1)
    # First starts: a after 10 ms, b after 10 ms (its second stamp is its first start).
    assert s["first_start_max_ms"] == pytest.approx(10.0, abs=0.01)
    assert s["new_task_p99_ms"] == pytest.approx(280.0, abs=0.01)
    assert s["all_new_started_s"] == pytest.approx(0.33)
    # 40 big starts and 4 new ones from 100.0 to 100.33.
    assert s["big_share_while_new_wait"] == round(40 / 44, 3)
    # Windows of 100 ms from the first arrival: (big starts, new starts).
    assert [w[1:] for w in s["windows_t_big_new"]] == [[30, 2], [5, 1], [5, 0], [5, 1]]
