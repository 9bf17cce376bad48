"""Workload W of the bench suite: the Redis cost of a chain step and a chord member against a
plain task (dtq_bench.flowcost), run small on the suite's own redis-server."""

from __future__ import annotations

import json
from pathlib import Path

from dtq_bench.suite import main


def test_workload_w_reports_chain_step_and_chord_member_against_a_plain_task(
    tmp_path: Path,
) -> None:
    argv = ["--peers", "none", "--workloads", "W", "--reps", "1", "--n-w", "60",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["medians"]) == {"W"}
    w = data["medians"]["W"]["dtq"]
    assert "errors" not in w, w
    assert w["n"] == 60
    for key in ("plain_b1", "plain_b16", "chain_step", "chord_member"):
        assert w[f"{key}_enqueue_us"] > 0 and w[f"{key}_run_us"] > 0
        total = w[f"{key}_enqueue_us"] + w[f"{key}_run_us"]
        assert abs(w[f"{key}_us"] - total) < 0.02  # (each rounded to 2 places)
    assert abs(w["chain_step_extra_us"] - (w["chain_step_us"] - w["plain_b1_us"])) < 0.02
    assert (
        w["plain_task_bytes"] > 0 and w["chord_member_bytes"] > w["flow_state_bytes_per_member"] > 0
    )
    md = (tmp_path / "results.md").read_text()
    assert "## W: workflow cost (dtq)" in md
    assert "| chain step (its completion releases the next), 1 at a time |" in md
    assert "Extra per chain step:" in md
