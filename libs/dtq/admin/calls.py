"""The operator scripts' calls: purge and the dead-letter transitions (``lua/purge.lua``,
``lua/dlq_requeue.lua``, ``lua/dlq_discard.lua``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtq import scripts as sc
from dtq.keys import GROUP, QueueKeys


def purge_call(
    qk: QueueKeys,
    limit: int,
    events_maxlen: int,
    nonce: str | None = None,
    flow_ttl_s: int = 86_400,
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce).
    With it, a purged workflow step ends its flow cancelled (kept ``flow_ttl_s``)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task_base, qk.idem_base, qk.lim_base]
    args: list[Any] = [GROUP, limit, events_maxlen, qk.done_base]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq]
        args += [sc.REPLY_TTL_MS, flow_ttl_s]
    return sc.Call("purge", keys, args)


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
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce)."""
    keys = [*qk.streams, qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [
        events_maxlen, "" if max_retries is None else max_retries, ",".join(allowed), len(tids),
        *tids,
    ]  # fmt: skip
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(sc.REPLY_TTL_MS)
    return sc.Call("dlq_requeue", keys, args)


def dlq_discard_call(
    qk: QueueKeys, tids: Sequence[str], *, events_maxlen: int, nonce: str | None = None
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce)."""
    keys = [qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [events_maxlen, len(tids), *tids]
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(sc.REPLY_TTL_MS)
    return sc.Call("dlq_discard", keys, args)
