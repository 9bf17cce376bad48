"""Bulk cancel: every unfinished task of a queue, or of a task name (``Client.cancel_many``).

Each task goes through the same ``lua/cancel.lua`` as a single ``cancel()``: queued and
scheduled tasks end ``cancelled`` at once, running ones are asked to stop (their worker records
``cancelled``), finished ones are left alone. Records are found with SCAN in bounded pages, so
tasks parked by a limit (which have no stream entry) are found too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from dtq import scripts as sc
from dtq.errors import InvalidRequest
from dtq.sdk.clientbase import CANCEL_REASON, ClientBase, Pipelined, Steps, TaskScan
from dtq.store.keys import make_task_id
from dtq.store.partitions import expand
from dtq.store.record import Field

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


def cancel_many_steps(
    client: ClientBase, queue: str | None, name: str | None, reason: str | None
) -> Steps[CancelSummary]:
    """Cancel every unfinished task of ``queue`` (all known queues if None) named ``name``:
    a bulk cancel, written once for both clients (each drives its I/O; see dtq.sdk.client)."""
    _check(queue, name)
    found: Any = (
        expand([queue], client.settings.queue_partitions)  # its partitions (dtq.store.partitions)
        if queue
        else (yield lambda r: r.smembers(client.keys.queues))
    )
    total = CancelSummary()
    for q in sorted(found):
        qk = client.keys.queue(q)
        base = qk.task_base
        cursor = 0
        while True:
            cursor, keys = yield TaskScan(qk, cursor, PAGE)
            tids = [str(k)[len(base) :] for k in keys]
            if tids:
                recs = yield partial(_statuses, keys=keys)
                chosen = _pick(tids, recs, name)
                if chosen:
                    why = reason or CANCEL_REASON
                    calls = [client._cancel_call(make_task_id(q, t), why) for t in chosen]
                    total += _summary((yield Pipelined(calls)))
            if int(cursor) == 0:
                break
    return total


def _statuses(r: Any, keys: list[Any]) -> Any:
    """Each record's status and name, pipelined (a reply, or its awaitable on asyncio)."""
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.hmget(k, [Field.STATUS, Field.NAME])
    return pipe.execute()
