"""The operator scripts' wrappers: purge and the dead-letter transitions (``lua/purge.lua``,
``lua/dlq_requeue.lua``, ``lua/dlq_discard.lua``); dtq.admin runs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dtq.scripts.runner import REPLY_TTL_MS, Call, to_str
from dtq.store.keys import GROUP, QueueKeys


class DlqVerdict(StrEnum):
    """dlq_requeue.lua's and dlq_discard.lua's answer per task: what was done, or the status
    of a task it left unchanged."""

    REQUEUED = "requeued"
    DISCARDED = "discarded"
    MISSING = "missing"
    """No record of the task (and, for a discard, not in the dead-letter queue)."""
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


def parse_dlq(raw: list[Any]) -> list[DlqVerdict]:
    """dlq_requeue.lua's or dlq_discard.lua's reply: one verdict per task, in order."""
    return [DlqVerdict(to_str(x)) for x in raw]


def purge_call(
    qk: QueueKeys,
    limit: int,
    events_maxlen: int,
    nonce: str | None = None,
    flow_ttl_s: int = 86_400,
) -> Call:
    """``nonce``: a re-send of this very call gets its first reply (see new_nonce).
    With it, a purged workflow step ends its flow cancelled (kept ``flow_ttl_s``)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task_base, qk.idem_base, qk.lim_base]
    args: list[Any] = [GROUP, limit, events_maxlen, qk.done_base]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq]
        args += [REPLY_TTL_MS, flow_ttl_s]
    return Call("purge", keys, args)


@dataclass(frozen=True, slots=True)
class PurgeBatch:
    queued: int
    scheduled: int
    more: bool


def parse_purge(raw: list[Any]) -> PurgeBatch:
    return PurgeBatch(int(raw[0]), int(raw[1]), int(raw[2]) == 1)


def dlq_requeue_call(
    qk: QueueKeys,
    tids: Sequence[str],
    *,
    events_maxlen: int,
    max_retries: int | None = None,
    allowed: Sequence[str] = ("failed",),
    nonce: str | None = None,
) -> Call:
    """``nonce``: a re-send of this very call gets its first reply (see new_nonce)."""
    keys = [*qk.streams, qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [
        events_maxlen,
        "" if max_retries is None else max_retries,
        ",".join(allowed),
        len(tids),
        *tids,
    ]
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(REPLY_TTL_MS)
    return Call("dlq_requeue", keys, args)


def dlq_discard_call(
    qk: QueueKeys, tids: Sequence[str], *, events_maxlen: int, nonce: str | None = None
) -> Call:
    """``nonce``: a re-send of this very call gets its first reply (see new_nonce)."""
    keys = [qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [events_maxlen, len(tids), *tids]
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(REPLY_TTL_MS)
    return Call("dlq_discard", keys, args)
