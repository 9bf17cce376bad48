"""The chaos soak's chord checks (tests/chaos/check.py, check_chords) on hand-made journals
and records: each invariant passes on a good chord and fails on the fault it is there for."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.chaos.check import check_chords

MEMBERS = ["default:m0", "default:m1", "default:m2"]
CHORD = {"flow": "default:wfX", "callback": "default:cb", "cb_idx": 1_000_000,
         "members": [0, 1, 2], "member_ids": MEMBERS}  # fmt: skip
RESULT = json.dumps({"idx": 1_000_000, "attempt": 1, "worker": "w1", "members": [0, 1, 2]})


def _good() -> tuple[dict[str, dict[str, str]], list[dict[str, Any]]]:
    records = {"default:cb": {"status": "succeeded", "result": RESULT},
               "default:wfX": {"status": "succeeded", "result": RESULT},
               **{m: {"status": "succeeded", "attempt": "1"} for m in MEMBERS}}  # fmt: skip
    journal: list[dict[str, Any]] = []
    for i, m in enumerate(CHORD["member_ids"]):
        journal += [{"ev": "start", "id": m, "attempt": 1, "t": 10.0 + i},
                    {"ev": "finish", "id": m, "attempt": 1, "t": 11.0 + i}]  # fmt: skip
    journal += [{"ev": "start", "id": "default:cb", "attempt": 1, "t": 20.0},
                {"ev": "finish", "id": "default:cb", "attempt": 1, "t": 21.0}]  # fmt: skip
    return records, journal


def _failed(records: Any, journal: Any) -> list[str]:
    out = check_chords([CHORD], records, journal)
    return [c["name"] for c in out["checks"] if not c["ok"]]


def test_a_good_chord_passes_every_check() -> None:
    records, journal = _good()
    out = check_chords([CHORD], records, journal)
    assert all(c["ok"] for c in out["checks"]) and len(out["checks"]) == 4
    assert out["figures"] == {"chords": 1, "chord_callback_attempts": 1}


def test_each_chord_invariant_catches_its_fault() -> None:
    records, journal = _good()
    lost = copy.deepcopy(records)
    lost["default:wfX"]["status"] = "running"
    assert _failed(lost, journal) == ["chords: every flow succeeded with its callback's result"]
    shuffled = copy.deepcopy(records)
    bad = json.dumps({"idx": 1_000_000, "attempt": 1, "worker": "w1", "members": [1, 0, 2]})
    shuffled["default:cb"]["result"] = shuffled["default:wfX"]["result"] = bad
    assert _failed(shuffled, journal) == [
        "chords: callback got every member's result, in member order"
    ]
    twice = [*journal, {"ev": "start", "id": "default:cb", "attempt": 1, "t": 22.0}]
    assert _failed(records, twice) == ["chords: callback started exactly once per attempt"]
    never = [e for e in journal if e["id"] != "default:cb"]
    assert _failed(records, never) == ["chords: callback started exactly once per attempt"]
    # A stale run of a member (attempt 1, frozen, fenced out) finishing late is fine...
    stale = copy.deepcopy(records)
    stale["default:m2"]["attempt"] = "2"
    late = [*journal, {"ev": "start", "id": "default:m2", "attempt": 2, "t": 14.0},
            {"ev": "finish", "id": "default:m2", "attempt": 2, "t": 15.0},
            {"ev": "finish", "id": "default:m2", "attempt": 1, "t": 25.0}]  # fmt: skip
    late = [e for e in late if not (e["id"] == "default:m2" and e["attempt"] == 1
                                    and e["t"] == 13.0)]  # fmt: skip
    assert _failed(stale, late) == []
    # ...but the stored run finishing after the callback started is not.
    early = [e for e in journal if not (e["id"] == "default:m2" and e["ev"] == "finish")]
    early.append({"ev": "finish", "id": "default:m2", "attempt": 1, "t": 25.0})
    assert _failed(records, early) == [
        "chords: no callback started before its last member finished"
    ]
