"""The retention pass's wrappers (retention_*.lua; the worker's dtq_worker.retention runs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from dtq.scripts.runner import Call
from dtq.stats import SLOTS
from dtq.store.keys import GROUP, QueueKeys


@dataclass(frozen=True, slots=True)
class DlqPruned:
    removed: int  # dead letters removed by this call
    remaining: int  # dead letters left in the queue's dead-letter zset


def retention_dlq_call(qk: QueueKeys, age_ms: int, cap: int, budget: int) -> Call:
    """Prune dead letters older than age_ms (on the Redis clock), beyond cap (oldest first),
    or whose record is gone; at most ``budget`` looked at."""
    return Call("retention_dlq", [qk.dlq, qk.task_base], [age_ms, cap, budget])


def parse_retention_dlq(raw: list[Any]) -> DlqPruned:
    return DlqPruned(int(raw[0]), int(raw[1]))


def consumer_prune_call(qk: QueueKeys, idle_ms: int) -> Call:
    """Delete the queue's stream consumers idle for idle_ms that hold no pending entry (the
    check and the delete in one step); the reply is the number deleted."""
    return Call("retention_consumers", qk.streams, [GROUP, idle_ms])


def parse_consumer_prune(raw: Any) -> int:
    return int(raw)


class QueueState(IntEnum):
    """retention_queue.lua's reply."""

    HOLDS_SOMETHING = 0
    EMPTY = 1
    """The queue holds nothing (with drop, its empty keys were deleted)."""


def queue_empty_call(qk: QueueKeys, drop: bool) -> Call:
    """Whether the queue holds nothing (lua/retention_queue.lua); with drop, its empty keys go."""
    keys = [*qk.streams, qk.sched, qk.dlq, qk.paused, qk.schedules, qk.lim_parked, qk.events]
    keys += [qk.stats, qk.fair, qk.decl, qk.flowq, qk.decl_seen, qk.schedules_seen]
    keys += [qk.group_index, qk.group_paused]
    return Call("retention_queue", keys, [GROUP, 1 if drop else 0])


def parse_queue_state(raw: Any) -> QueueState:
    return QueueState(int(raw))


@dataclass(frozen=True, slots=True)
class KeysSwept:
    idem_deleted: int  # idempotency keys without a TTL whose task record is gone, deleted
    expired: int  # finished records without a TTL given one


def retention_keys_call(qk: QueueKeys, keys: Sequence[str], ttl_s: int) -> Call:
    """Look at these record and idempotency keys of the queue (found by a SCAN): delete an
    idempotency key without a TTL whose task is gone, give a finished record without a TTL
    ``ttl_s``."""
    return Call("retention_keys", [qk.task_base, qk.idem_base, *keys], [ttl_s])


def parse_retention_keys(raw: list[Any]) -> KeysSwept:
    return KeysSwept(int(raw[0]), int(raw[1]))


def hist_fold_call(qk: QueueKeys, minutes: Sequence[int], ttl_s: int) -> Call:
    """Fold the queue's enqueue counters of ``minutes`` (minutes since the epoch) into its hour
    strings (lua/retention_hist.lua; dtq.stats), each hour string kept ``ttl_s`` after its hour
    ends; the reply is the number folded."""
    hours = sorted({m // 60 for m in minutes})
    at = {h: len(minutes) + 1 + i for i, h in enumerate(hours)}  # KEYS index (1-based)
    keys = [f"{qk.hist_enq_base}{m}" for m in minutes] + [f"{qk.hist_base}{h}" for h in hours]
    args: list[Any] = [len(minutes), *(at[m // 60] for m in minutes)]
    args += [f"#{m % 60 * SLOTS}" for m in minutes]
    args += [(h + 1) * 3600 + ttl_s for h in hours]
    return Call("retention_hist", keys, args)
