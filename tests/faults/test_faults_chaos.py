"""The short seeded chaos soak, inside the normal test run (CI runs ``make test``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.check import markdown
from tests.chaos.run import Config, Soak


def soak_passes(cfg: Config, out: Path) -> dict[str, Any]:
    report = Soak(cfg, out).run()
    print(markdown(report))
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, json.dumps({"failed": failed, "problems": report["problems"]})[:5000]
    fig = report["figures"]
    # The soak must really have hurt: every fault kind happened and runs were interrupted.
    assert set(fig["faults"]) == {"kill", "stop", "redis", "cut", "lostreply"}
    assert fig["interrupted_runs"] > 0
    assert fig["status"] == {"succeeded": fig["tasks"]}
    return fig


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_soak_short_seeded(tmp_path: Path) -> None:
    # A fifth of the work as chords of 50 members, their joins checked (check_chords).
    fig = soak_passes(Config(seconds=40, seed=20261130, chord_share=0.2), tmp_path / "chaos")
    assert fig["chords"] > 0 and fig["chord_callback_attempts"] >= fig["chords"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_soak_with_runs_claimed_ahead(tmp_path: Path) -> None:
    """The same soak with DTQ_WORKER_PREFETCH=4: runs waiting for a slot are killed, frozen,
    cut off and reclaimed too, and still no task is lost and no attempt starts twice."""
    soak_passes(Config(seconds=40, seed=20261201, prefetch=4), tmp_path / "chaos")
