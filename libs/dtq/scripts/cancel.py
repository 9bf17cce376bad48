"""cancel.lua's wrapper: cancel a task, or ask its running attempt to stop."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dtq.scripts.runner import REPLY_TTL_MS, Call, to_str
from dtq.store.keys import QueueKeys


class CancelOutcome(StrEnum):
    """What cancel.lua did (the first element of its reply)."""

    CANCELLED = "cancelled"
    """The task was queued or scheduled: it ended cancelled now."""
    REQUESTED = "requested"
    """The task is running: its cancel was requested (the run stops, or its outcome honours
    the request)."""
    UNCHANGED = "unchanged"
    """The task had ended already: nothing changed."""
    MISSING = "missing"
    """No record of the task (never enqueued, or expired)."""


@dataclass(frozen=True, slots=True)
class CancelResult:
    outcome: CancelOutcome
    status: str  # the task's status after the call ("" when missing)


def cancel_call(
    qk: QueueKeys,
    tid: str,
    *,
    events_maxlen: int,
    ttl_s: int,
    hint_channel: str,
    reason: str,
    nonce: str | None = None,
) -> Call:
    """``nonce``: answer a re-send of this very call with its first reply (see new_nonce)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task(tid), qk.idem_base]
    args: list[Any] = [tid, events_maxlen, ttl_s, qk.done_channel(tid), hint_channel, reason]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq, qk.lim_base]
        args.append(REPLY_TTL_MS)
    return Call("cancel", keys, args)


def parse_cancel(raw: list[Any]) -> CancelResult:
    return CancelResult(CancelOutcome(to_str(raw[0])), to_str(raw[1]))
