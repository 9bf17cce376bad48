"""The workflow scripts' wrappers (flow_*.lua): dtq.workflows plans a flow; these send it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from dtq.scripts.runner import REPLY_TTL_MS, Call, to_str
from dtq.store.keys import QueueKeys


class FlowStatus(StrEnum):
    """A flow's status (its hash's ``status``), as flow_enqueue.lua and flow_cancel.lua answer."""

    NONE = ""
    """flow_cancel.lua: no such flow."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Created(IntEnum):
    """flow_put.lua's and flow_tomb.lua's reply."""

    EXISTED = 0
    """The record was there already: nothing was written."""
    CREATED = 1


class Applied(IntEnum):
    """flow_apply.lua's reply."""

    NOT_APPLIED = 0
    """The note was counted before, or the flow is gone."""
    APPLIED = 1


@dataclass(frozen=True, slots=True)
class FlowEnqueued:
    status: FlowStatus
    created: bool  # False: the flow existed (a re-send of this very call)


@dataclass(frozen=True, slots=True)
class FlowCancelled:
    before: FlowStatus  # NONE: no such flow
    steps: list[str]  # "queue:tid" of each released step that had not ended, to cancel


def home_keys(qk: QueueKeys) -> list[str]:
    """The KEYS of the scripts that run at a flow's home queue."""
    return [*qk.streams, qk.sched, qk.events, qk.task_base, qk.flow_base, qk.flowq]


def flow_enqueue_call(home: QueueKeys, head: Sequence[Any], steps: Sequence[Any]) -> Call:
    """flow_enqueue.lua's call: ``head`` its first 6 ARGV (events maxlen, flow tid, number of
    steps, root and tree JSON, max payload), ``steps`` 5 ARGV per step (see the script)."""
    return Call("flow_enqueue", home_keys(home), [*head, *steps])


def parse_flow_enqueue(raw: list[Any]) -> FlowEnqueued:
    return FlowEnqueued(FlowStatus(to_str(raw[0])), int(raw[1]) == 1)


def flow_put_call(qk: QueueKeys, spec: str, args: str, events_maxlen: int) -> Call:
    """flow_put.lua: create a released step on its own queue (idempotent: its put marker,
    :meth:`QueueKeys.flow_put`, outlives the step's record)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task_base, qk.flow_put(json.loads(spec)[1])]
    return Call("flow_put", keys, [events_maxlen, spec, args])


def parse_created(raw: Any) -> Created:
    return Created(int(raw))


def flow_apply_call(
    home: QueueKeys, ftid: str, step: str, status: str, payload: str, events_maxlen: int, ttl: int
) -> Call:
    """flow_apply.lua: a step's outcome noted on another slot, applied at its flow's home."""
    return Call(
        "flow_apply",
        home_keys(home),
        [events_maxlen, ttl, home.done_base, ftid, step, status, payload],
    )


def parse_applied(raw: Any) -> Applied:
    return Applied(int(raw))


def flow_cancel_call(
    home: QueueKeys, ftid: str, reason: str, ttl: int, events_maxlen: int, nonce: str | None = None
) -> Call:
    """flow_cancel.lua. ``nonce``: a re-send of this very call gets its first reply."""
    keys = [home.flow(ftid), home.events]
    args: list[Any] = [reason, ttl, home.done_channel(ftid), events_maxlen]
    if nonce is not None:
        keys.append(home.reply(nonce))
        args.append(REPLY_TTL_MS)
    return Call("flow_cancel", keys, args)


def parse_flow_cancel(raw: list[Any]) -> FlowCancelled:
    return FlowCancelled(FlowStatus(to_str(raw[0])), [to_str(x) for x in raw[1:]])


def flow_tomb_call(qk: QueueKeys, tid: str, reason: str, ttl: int) -> Call:
    """flow_tomb.lua: a cancelled flow's step not created yet is written cancelled (and its
    put marker set, so a put moved after the record expired creates nothing)."""
    return Call("flow_tomb", [qk.task(tid), qk.flow_put(tid)], [reason, ttl])
