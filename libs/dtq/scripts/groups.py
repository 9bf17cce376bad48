"""group_hold.lua's wrapper: hold (pause) or release (resume) one fair group of a queue."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from dtq.scripts.runner import Call
from dtq.store.keys import QueueKeys


class Held(IntEnum):
    """group_hold.lua's reply."""

    UNCHANGED = 0
    """The group already was held (a pause) or not held (a resume)."""
    CHANGED = 1


def group_hold_call(qk: QueueKeys, group: str, hold: bool, events_maxlen: int) -> Call:
    """Hold (``hold``: pause) or release (resume) ``group`` of the physical queue ``qk``."""
    return Call(
        "group_hold",
        [*qk.streams, qk.group_base, qk.events],
        [group, "1" if hold else "0", events_maxlen],
    )


def parse_group_hold(raw: Any) -> Held:
    return Held(int(raw))
