"""The chaos soak's group checks (tests/chaos/groups.py) on hand-made runs, records and holds:
each passes on good data and fails on the fault it is there for; the group draw keeps the
heavy groups heavy and leaves a seed's other draws alone."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from tests.chaos.check import Run, analyze
from tests.chaos.groups import (
    GroupPlan,
    Hold,
    cap_excess,
    check_groups,
    group_names,
    pick_group,
    starts_while_held,
)

IDS = {0: "default:a", 1: "default:b", 2: "default:c", 3: "default:d"}
GROUPS = {0: "g00", 1: "g00", 2: "g00"}  # 3 ungrouped


def _plan(fate: dict[int, str] | None = None) -> GroupPlan:
    plan = GroupPlan(1.0, 1, 1, seed=1)
    plan.group_of = dict(GROUPS)
    plan.fate = fate or {}
    return plan


def _run(tid: str, start: float, end: float, kind: str = "finish", attempt: int = 1,
         worker: str = "w1") -> Run:  # fmt: skip
    return Run(tid, attempt, worker, 1, start, end, kind)


def _check(runs: dict[str, list[Run]], **kw: Any) -> list[str]:
    records = {tid: {"status": "succeeded", "enq": "1000"} for tid in IDS.values()}
    for idx, g in GROUPS.items():
        records[IDS[idx]]["grp"] = g
    args: dict[str, Any] = dict(
        ids=IDS, plan=_plan(), heavy=["g00"], records=records,
        runs_by_task=runs, frozen={}, holds=[], leftover={}, cap=2,
        heartbeat_s=0.5, slack_s=0.5,
    )  # fmt: skip
    out = check_groups(**(args | kw))
    return [c["name"].split(":")[1].split("(")[0].strip() for c in out["checks"] if not c["ok"]]


def _two_at_once() -> dict[str, list[Run]]:
    """a and b (group g00) overlap 11-12, c (g00) follows b; d has no group."""
    spans = {"a": (10, 12), "b": (11, 13), "c": (13, 14), "d": (10, 14)}
    return {f"default:{k}": [_run(f"default:{k}", *v)] for k, v in spans.items()}


def test_good_groups_pass() -> None:
    assert _check(_two_at_once()) == []


def test_a_key_left_behind_fails() -> None:
    left = {"chaos:{chaos:default}:g:idx": {"type": "zset", "content": [["g00", 1.0]]}}
    assert _check(_two_at_once(), leftover=left) == ["no group key left once every task ended"]


def test_a_record_without_its_group_fails() -> None:
    records = {tid: {"status": "succeeded"} for tid in IDS.values()}
    records["default:a"]["grp"] = records["default:b"]["grp"] = "g00"
    records["default:d"]["grp"] = ""  # ungrouped stored while groups were active: fine
    assert _check(_two_at_once(), records=records) == ["every record names its task's group"]


def test_a_status_not_planned_fails() -> None:
    runs = _two_at_once()
    cancelled = {t: {"status": "succeeded", "grp": "g00"} for t in IDS.values()}
    cancelled["default:d"] = {"status": "cancelled"}
    assert _check(runs, records=cancelled) == ["every task ended as planned"]
    assert _check(runs, records=cancelled, plan=_plan({3: "cancel"})) == []
    assert _check(runs, records=cancelled, plan=_plan({3: "expire"})) == [
        "every task ended as planned"
    ]
    failed = cancelled | {"default:d": {"status": "failed"}}
    assert _check(runs, records=failed, plan=_plan({3: "fail_always"})) == []
    assert _check(runs, plan=_plan({3: "fail_always"})) == ["every task ended as planned"]
    assert _check(runs, plan=_plan({3: "fail_once", 2: "cancel", 1: "expire"})) == []


def test_three_runs_of_a_group_over_a_cap_of_two_fail() -> None:
    runs = _two_at_once()
    runs["default:c"] = [_run("default:c", 11.5, 14)]
    assert _check(runs) == ["at most 2 runs of a group at once"]
    assert _check(runs, cap=3) == [] and _check(runs, cap=0) == []
    # the ungrouped task d (running throughout) is not counted in any named group
    assert _check(_two_at_once(), cap=1) == ["at most 1 runs of a group at once"]


def test_a_lost_claims_run_may_exceed_the_cap_for_one_heartbeat() -> None:
    # a's first run lost its claim (frozen 10.5-12.2, reclaimed, run again from 12.0): its
    # tail after its group's third run started (12.0) is 0.2 s of live time
    runs = _two_at_once()
    runs["default:a"] = [_run("default:a", 10, 12.4, "cancelled", 1, "w2"),
                         _run("default:a", 12.0, 12.5, "finish", 2)]  # fmt: skip
    frozen = {"w2": [(10.5, 12.2)]}
    assert _check(runs, frozen=frozen) == []
    # ...not for longer: 1.2 s live after the cap was passed
    runs["default:a"][0].end = 13.4
    assert _check(runs, frozen=frozen) == ["at most 2 runs of a group at once"]
    # ...and a run that is its task's last is no lost claim
    runs["default:a"] = [_run("default:a", 10, 12.4, "finish", 1, "w2")]
    runs["default:c"] = [_run("default:c", 12.0, 12.5)]
    assert _check(runs, frozen=frozen) == ["at most 2 runs of a group at once"]


def test_a_run_counts_until_its_task_ended() -> None:
    # c (a sync task) was cancelled at 11.5 while its thread ran on to 12.5: its place went
    # with the cancel, and b's run from 11.6 is within the cap
    runs = _two_at_once()
    runs["default:c"] = [_run("default:c", 11.0, 12.5)]
    runs["default:b"] = [_run("default:b", 11.6, 13)]
    records = {t: {"status": "succeeded", "grp": "g00"} for t in IDS.values()}
    records["default:d"] = {"status": "succeeded"}
    assert _check(runs, records=records) == ["at most 2 runs of a group at once"]
    records["default:c"] |= {"status": "cancelled", "finished": "11500"}
    assert _check(runs, records=records, plan=_plan({2: "cancel"})) == []
    records["default:c"]["finished"] = "11700"  # ended after b started: over the cap
    assert _check(runs, records=records, plan=_plan({2: "cancel"})) == [
        "at most 2 runs of a group at once"
    ]


def test_a_start_while_held_fails_unless_claimed_before_the_hold() -> None:
    runs = _two_at_once()
    assert _check(runs, holds=[Hold("g00", 12.0, 14.0)]) == [
        "no run of a held group started while it was held"
    ]
    assert _check(runs, holds=[Hold("g00", 12.6, 14.0)]) == []  # within the 0.5 s slack
    assert _check(runs, holds=[Hold("g01", 12.0, 14.0)]) == []  # another group
    frozen = {"w1": [(12.0, 12.9)]}  # its worker froze before the hold: claimed before it
    assert _check(runs, holds=[Hold("g00", 12.1, 14.0)], frozen=frozen) == []


def test_cap_excess_counts_the_peak() -> None:
    peak, bad, excused = cap_excess({"g": _two_at_once()["default:a"]}, set(), 1, {}, 1.0)
    assert (peak, bad, excused) == ({"g": 1}, [], 0)
    assert starts_while_held({}, [Hold("g", 0, 1)], {}, 0.5) == ([], 0)


def test_pick_group_gives_the_heavy_groups_half_and_draws_twice() -> None:
    names = group_names(16)
    rng = random.Random(3)
    got = Counter(pick_group(rng, 0.8, names, 3) for _ in range(20_000))
    assert 0.17 < got[None] / 20_000 < 0.23
    heavy = sum(got[g] for g in names[:3]) / (20_000 - got[None])
    assert 0.47 < heavy < 0.53
    assert all(got[g] > 0 for g in names)
    a, b = random.Random(9), random.Random(9)
    pick_group(a, 0.0, names, 3)
    b.random(), b.random()
    assert a.random() == b.random()


def test_the_plan_gives_groups_and_fates() -> None:
    plan = GroupPlan(0.0, 16, 3, seed=1)
    assert plan.options(1) == ({}, {}) and plan.group_of == {}
    plan = GroupPlan(1.0, 4, 1, seed=1)
    got = [plan.options(i) for i in range(2000)]
    assert len(plan.group_of) == 2000
    assert all(o["group"] in group_names(4) for o, _ in got)
    fates = Counter(plan.fate.values())
    assert set(fates) == {"delay", "fail_once", "fail_always", "cancel", "expire"}
    assert 0.1 < sum(fates.values()) / 2000 < 0.18
    for i, f in plan.fate.items():
        opts, kw = got[i]
        assert {
            "delay": "delay" in opts and not kw,
            "fail_once": kw == {"fail": "once"},
            "fail_always": kw == {"fail": "always"} and opts["max_retries"] == 1,
            "cancel": i in plan.cancel_after and not kw,
            "expire": "expires" in opts and not kw,
        }[f]
    assert all(
        not kw and set(o) == {"group"} for i, (o, kw) in enumerate(got) if i not in plan.fate
    )
    steps = GroupPlan(1.0, 4, 1, seed=1)
    assert all(set(steps.options(i, fates=False)[0]) == {"group"} for i in range(500))
    assert steps.fate == {}


def test_a_planned_failure_explains_its_retry_and_nothing_else_does() -> None:
    def journal(first_end: str) -> list[dict[str, Any]]:
        ev = {"id": "default:a", "idx": 0, "worker": "w1", "pid": 1}
        return [ev | {"ev": "start", "attempt": 1, "t": 1.0},
                ev | {"ev": first_end, "attempt": 1, "t": 1.1},
                ev | {"ev": "start", "attempt": 2, "t": 2.0},
                ev | {"ev": "finish", "attempt": 2, "t": 2.1}]  # fmt: skip

    def reexec_check(first_end: str) -> dict[str, Any]:
        out = analyze(
            ids={0: "default:a"}, journal=journal(first_end), faults=[], workers=[],
            records={"default:a": {"status": "succeeded", "attempt": "2", "result":
                                   '{"idx": 0, "attempt": 2, "worker": "w1"}'}},
            heartbeat_s=0.5, visibility_s=3.0, slack_s=0.5, stats={}, claims_lost_logged=0,
            stale_rejected_logged=0,
        )  # fmt: skip
        assert out["checks"][4]["name"] == "re-executions == runs interrupted by a fault"
        return {"ok": out["checks"][4]["ok"], "by": out["figures"]["interrupted_by"]}

    assert reexec_check("raised") == {"ok": True, "by": {"raised": 1}}
    assert reexec_check("finish") == {"ok": False, "by": {}}
