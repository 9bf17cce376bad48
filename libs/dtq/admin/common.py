"""What every part of :class:`dtq.admin.Admin` shares: its bounds, its errors, its checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from dtq.errors import InvalidRequest
from dtq.models import TaskStatus
from dtq.store.keys import QUEUE_NAME_RE

BATCH = 500
"""Tasks handled per script call by purge and bulk dead-letter operations."""
MAX_PAGE = 1000
HISTORY_SCAN = 20_000
"""Most event-stream entries read to build one task's history."""
SCAN_BUDGET = 20
"""Most SCAN calls (COUNT 1000 each) one task listing makes before answering with a cursor."""
DLQ_BUDGET = 10_000
"""Most zset entries one dead-letter (or failed/scheduled) listing examines per request."""
RETRYABLE = ("failed", "cancelled", "expired")

Progress = Callable[[int], None]
T = TypeVar("T")
Pick = Callable[[list[tuple[str, float]]], Awaitable[list[T | None]]]
"""Each zset entry's (member, score) item, or None to leave it out: one read for a chunk."""


async def pipelined(r: Any, items: Sequence[T], add: Callable[[Any, T], object]) -> list[Any]:
    """``add(pipe, item)`` for each item, sent in one round trip (none for no items, no
    transaction); the replies in order."""
    if not items:
        return []
    async with r.pipeline(transaction=False) as pipe:
        for item in items:
            add(pipe, item)
        replies: list[Any] = await pipe.execute()
    return replies


async def zset_scan(
    r: Any, key: str, pos: int, want: int, budget: int, pick: Pick[T], newest_first: bool = False
) -> tuple[list[T], int | None, int]:
    """Up to ``want`` items picked from zset ``key``'s entries from rank ``pos``, at most
    ``budget`` entries read; the items, the rank to go on from (None: the end), entries read."""
    out: list[T] = []
    seen = 0
    read = r.zrevrange if newest_first else r.zrange
    while len(out) < want and seen < budget:
        n = min(max(want, 200), budget - seen)
        entries = await read(key, pos, pos + n - 1, withscores=True)
        seen += len(entries)
        for i, item in enumerate(await pick(entries)):
            if item is not None:
                out.append(item)
                if len(out) >= want:
                    return out, pos + i + 1, seen
        pos += len(entries)
        if len(entries) < n:
            return out, None, seen
    return out, pos, seen


async def records(r: Any, keys: Sequence[str]) -> list[dict[str, str]]:
    """Each hash of ``keys`` (task records), in one round trip."""
    return await pipelined(r, keys, lambda p, k: p.hgetall(k))


def check_queue_name(name: str) -> None:
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise InvalidRequest(f"bad queue name {name!r}: use letters, digits, '_', '.', '-'")


def check_listing(queue: str | None, status: str | None, limit: int) -> None:
    """The filters both task listings take (the SCAN one and the newest-first one)."""
    if queue is not None:
        check_queue_name(queue)
    if status is not None and status not in TaskStatus._value2member_map_:
        raise InvalidRequest(
            f"unknown status {status!r}; one of {', '.join(s.value for s in TaskStatus)}"
        )
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")


def as_int(value: str | None) -> int:
    """A counter field as an int; 0 when missing or unreadable (never a 500 for a listing)."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


def chunks(items: Sequence[str], n: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def id_ms(entry_id: str) -> int:
    """The millisecond part of a stream entry id."""
    return int(entry_id.split("-", 1)[0])


def stream_pos(entry_id: str) -> tuple[int, int]:
    """A stream entry id as (ms, seq), ordered as Redis orders ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def parse_cursor(cursor: str | None) -> tuple[str, int]:
    """``<scan cursor>.<skip>`` (``<primary>:<scan cursor>.<skip>`` on a cluster walk)."""
    if not cursor:
        return "0", 0
    head, _, tail = cursor.partition(".")
    node, _, at = head.rpartition(":")  # "<primary>:<cursor>" on a cluster (dtq.store.cluster)
    rest = node + tail  # digits, when present
    if not at.isdigit() or int(at) >= 2**64 or (rest and not rest.isdigit()):
        raise InvalidRequest(f"bad cursor {cursor!r}")
    return head, int(tail or 0)


def position(cursor: str | None) -> tuple[str, int]:
    """A cursor of a listing that is no SCAN walk (no "<primary>:" part)."""
    head, skip = parse_cursor(cursor)
    if ":" in head:
        raise InvalidRequest(f"bad cursor {cursor!r}")
    return head, skip
