"""The reaper's and the heartbeat's wrappers: reclaim.lua (runs of dead workers), touch.lua
(the heartbeat of held runs) and promote.lua (due scheduled tasks to their streams)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from dtq.scripts.outcomes import RunRef
from dtq.scripts.runner import Call, to_str
from dtq.store.keys import GROUP, QueueKeys


class TouchMark(StrEnum):
    """touch.lua's reply is ``{lost tids..., '|', cancel-requested tids...}``."""

    SEPARATOR = "|"


class PromoteSentinel(IntEnum):
    """promote.lua's next due (or next fire) time when nothing is scheduled."""

    NONE_DUE = -1


# XAUTOCLAIM calls one reclaim.lua call makes at most.
RECLAIM_STEPS = 10


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    requeued: int
    failed: int
    absorbed: int
    # Where the pass goes on (KEYS index 1..10, p9 first; 0 once complete) and the cursor in it.
    band: int = 0
    cursor: str = "0-0"
    steps: int = 0  # XAUTOCLAIM calls this call made
    cancelled: int = 0  # lost runs whose cancel was requested: ended "cancelled"

    @property
    def more(self) -> bool:
        """The pass is not complete: call again from ``band``/``cursor``."""
        return self.band != 0

    def __add__(self, other: ReclaimResult) -> ReclaimResult:
        """The counts of both (a pass of several calls, a pass over several queues)."""
        return ReclaimResult(
            self.requeued + other.requeued,
            self.failed + other.failed,
            self.absorbed + other.absorbed,
            cancelled=self.cancelled + other.cancelled,
        )


def reclaim_call(
    qk: QueueKeys,
    worker_id: str,
    *,
    min_idle_ms: int,
    count: int,
    events_maxlen: int,
    ttl_s: int,
    band: int = 1,
    cursor: str = "0-0",
    steps: int = RECLAIM_STEPS,
) -> Call:
    """One bounded step of a reclaim pass (see reclaim.lua): from ``band``/``cursor`` (a new
    pass by default), at most ``steps`` XAUTOCLAIMs of COUNT ``count``, at most ``count``
    entries adopted."""
    keys = [*qk.streams, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.lim_base]
    head = [GROUP, worker_id, min_idle_ms, count, events_maxlen, ttl_s, qk.done_base, band]
    return Call("reclaim", [*keys, qk.flow_base, qk.flowq], [*head, cursor, steps])


def parse_reclaim(raw: list[Any]) -> ReclaimResult:
    return ReclaimResult(
        int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]), to_str(raw[4]), int(raw[5]), int(raw[6])
    )


@dataclass(frozen=True, slots=True)
class TouchResult:
    lost: list[str]
    cancel_requested: list[str]


def touch_call(qk: QueueKeys, worker_id: str, runs: Sequence[RunRef]) -> Call:
    args: list[Any] = [GROUP, worker_id, len(runs)]
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    return Call("touch", [*qk.streams, qk.task_base], args)


def parse_touch(raw: list[Any]) -> TouchResult:
    items = [to_str(x) for x in raw]
    cut = items.index(TouchMark.SEPARATOR)
    return TouchResult(items[:cut], items[cut + 1 :])


@dataclass(frozen=True, slots=True)
class PromoteResult:
    promoted: int
    dropped: int
    next_due_ms: int | None
    owed: bool = False  # limit keys are owed a release (limit_sweep.lua has work)
    next_fire_ms: int | None = None  # the queue's next periodic schedule fire
    now_ms: int = 0  # the server's time of the call


def promote_call(qk: QueueKeys, limit: int, events_maxlen: int) -> Call:
    keys = [*qk.streams, qk.sched, qk.events, qk.task_base, qk.lim_owed, qk.schedules_next]
    return Call("promote", keys, [limit, events_maxlen])


def _ms(raw: Any) -> int | None:
    n = int(raw)
    return None if n <= PromoteSentinel.NONE_DUE else n


def parse_promote(raw: list[Any]) -> PromoteResult:
    return PromoteResult(
        int(raw[0]), int(raw[1]), _ms(raw[2]), int(raw[3]) == 1, _ms(raw[4]), int(raw[5])
    )
