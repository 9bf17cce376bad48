"""limit_sweep.lua's wrapper: release tasks parked behind a fleet limit (dtq.limits)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtq.scripts.runner import Call
from dtq.store.keys import QueueKeys


@dataclass(frozen=True, slots=True)
class SweepResult:
    released: int  # parked tasks given a stream entry again
    more: bool  # the call's budget ran out: call again


def limit_sweep_call(qk: QueueKeys, limit_keys: Sequence[str]) -> Call:
    """Release parked tasks of these limit keys (none: the keys owed a release)."""
    return Call("limit_sweep", [*qk.streams, qk.task_base, qk.lim_base], list(limit_keys))


def parse_limit_sweep(raw: list[Any]) -> SweepResult:
    return SweepResult(int(raw[0]), int(raw[1]) == 1)
