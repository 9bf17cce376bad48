"""Bulk cancel: every unfinished task of a queue, or of a task name (``Client.cancel_many``).

Each task goes through the same ``lua/cancel.lua`` as a single ``cancel()``: queued and
scheduled tasks end ``cancelled`` at once, running ones are asked to stop (their worker records
``cancelled``), finished ones are left alone. Records are found with SCAN in bounded pages, so
tasks parked by a limit (which have no stream entry) are found too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.cluster import atask_key_pages, task_key_pages
from dtq.errors import InvalidRequest

if TYPE_CHECKING:
    from dtq.client import AsyncClient, Client

PAGE = 500
UNFINISHED = ("queued", "scheduled", "running")


@dataclass(frozen=True, slots=True)
class CancelSummary:
    """What a bulk cancel did."""

    cancelled: int = 0
    """Queued or scheduled tasks that ended ``cancelled``."""
    requested: int = 0
    """Running tasks whose workers were asked to stop them."""

    @property
    def total(self) -> int:
        return self.cancelled + self.requested

    def to_dict(self) -> dict[str, int]:
        return {"cancelled": self.cancelled, "requested": self.requested}

    def __add__(self, other: CancelSummary) -> CancelSummary:
        return CancelSummary(self.cancelled + other.cancelled, self.requested + other.requested)


def _check(queue: str | None, name: str | None) -> None:
    if queue is None and name is None:
        raise InvalidRequest("cancel_many needs a queue, a task name, or both")


def _pick(tids: list[str], recs: Iterable[Any], name: str | None) -> list[str]:
    out = []
    for tid, (status, tname) in zip(tids, recs, strict=True):
        if status in UNFINISHED and (name is None or tname == name):
            out.append(tid)
    return out


def _summary(replies: Iterable[Any]) -> CancelSummary:
    res = [sc.parse_cancel(r) for r in replies]
    return CancelSummary(
        sum(r.outcome == "cancelled" for r in res), sum(r.outcome == "requested" for r in res)
    )


def cancel_many(
    client: Client, queue: str | None = None, name: str | None = None, reason: str | None = None
) -> CancelSummary:
    """Cancel every unfinished task of ``queue`` (all known queues if None) named ``name``."""
    _check(queue, name)
    found: Any = [queue] if queue else client.redis.smembers(client.keys.queues)
    total = CancelSummary()
    scripts = client._scripts  # the client's runner: scripts already registered
    for q in sorted(found):
        base = client.keys.queue(q).task_base
        for keys in task_key_pages(client.redis, client.keys.queue(q), PAGE):
            tids = [str(k)[len(base) :] for k in keys]
            if tids:
                with client.redis.pipeline(transaction=False) as pipe:
                    for k in keys:
                        pipe.hmget(k, ["status", "name"])
                    recs = pipe.execute()
                chosen = _pick(tids, recs, name)
                if chosen:
                    with client.redis.pipeline(transaction=False) as pipe:
                        for tid in chosen:
                            call = client._cancel_call(f"{q}:{tid}", reason or _reason())
                            scripts.run(call, pipe)
                        total += _summary(pipe.execute())
    return total


async def acancel_many(
    client: AsyncClient,
    queue: str | None = None,
    name: str | None = None,
    reason: str | None = None,
) -> CancelSummary:
    """:func:`cancel_many` for asyncio."""
    _check(queue, name)
    found: Any = [queue] if queue else await client.redis.smembers(client.keys.queues)  # type: ignore[misc]
    total = CancelSummary()
    scripts = client._scripts
    for q in sorted(found):
        base = client.keys.queue(q).task_base
        async for keys in atask_key_pages(client.redis, client.keys.queue(q), PAGE):
            tids = [str(k)[len(base) :] for k in keys]
            if tids:
                async with client.redis.pipeline(transaction=False) as pipe:
                    for k in keys:
                        pipe.hmget(k, ["status", "name"])
                    recs = await pipe.execute()
                chosen = _pick(tids, recs, name)
                if chosen:
                    async with client.redis.pipeline(transaction=False) as pipe:
                        for tid in chosen:
                            call = client._cancel_call(f"{q}:{tid}", reason or _reason())
                            await scripts.run(call, pipe)
                        total += _summary(await pipe.execute())
    return total


def _reason() -> str:
    from dtq.client import CANCEL_REASON

    return CANCEL_REASON
