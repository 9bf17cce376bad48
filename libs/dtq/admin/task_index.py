"""The newest-first task list, read from indexes Redis already keeps (no SCAN, no new write):
each queue's event stream, whose ``enqueued`` events name every task, and the consumer groups'
pending entries for the running ones. Bounds, reach and cursor: docs/operations.md,
"Pagination".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis

from dtq.admin.common import pipelined, records, stream_pos
from dtq.admin.views import task_info
from dtq.store.keys import GROUP, Keys, make_task_id

INDEX_BUDGET = 20_000
"""Most event-stream entries one task page reads before answering with a cursor."""
RECORD_BUDGET = 5000
"""Most task records (HGETALL) one task page reads before answering with a cursor."""
FETCH_MIN = 100
"""Fewest records read per round trip (more when the page still needs more)."""
CHUNK = 1000
RUNNING_MAX = 200
"""Most running tasks listed on a first page."""


Pos = tuple[int, int, str, int]
"""A task's place in the list: its enqueued event's stream id (ms, seq), its queue (two
queues' streams can hold the same id), then its index among the tids of that entry (a bulk
enqueue's entry holds several; the later the newer)."""


def parse_cursor(cursor: str | None) -> Pos | None:
    """The position of the last task listed, from ``<ms>.<seq>[-<index>].<queue>`` (None: the
    start)."""
    if not cursor:
        return None
    ms, _, rest = cursor.partition(".")
    seq, _, queue = rest.partition(".")
    seq, _, idx = seq.partition("-")
    idx = idx or "0"
    if not all(x.isdigit() and len(x) <= 19 for x in (ms, seq, idx)):
        raise ValueError(f"bad cursor {cursor!r}")
    return int(ms), int(seq), queue, int(idx)


def make_cursor(pos: Pos) -> str:
    idx = f"-{pos[3]}" if pos[3] else ""
    return f"{pos[0]}.{pos[1]}{idx}.{pos[2]}"


async def newest(
    r: aredis.Redis,
    keys: Keys,
    queues: Sequence[str],
    *,
    status: str | None,
    name: str | None,
    cursor: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None, int]:
    """Tasks of ``queues`` newest first, filtered; returns (items, next_cursor, entries read).

    Streams are read in rounds of ``CHUNK`` entries each below a common upper bound; only the
    entries newer than every full chunk's oldest (the round's cut) are complete across queues,
    so those are listed, and the next round starts at the cut.
    """
    after = parse_cursor(cursor)
    upper = "+" if after is None else f"{after[0]}-{after[1]}"  # inclusive: ties by queue
    ev = {q: keys.queue(q).events for q in queues}
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    read = fetched = 0
    while read < INDEX_BUDGET:
        async with r.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.xrevrange(ev[q], max=upper, min="-", count=CHUNK)
            chunks: list[list[tuple[str, dict[str, str]]]] = await pipe.execute()
        cut: tuple[int, int] | None = None
        for chunk in chunks:
            read += len(chunk)
            if len(chunk) == CHUNK:
                oldest = stream_pos(chunk[-1][0])
                cut = oldest if cut is None or oldest > cut else cut
        cands: list[tuple[Pos, str]] = []
        for q, chunk in zip(queues, chunks, strict=True):
            for eid, f in chunk:
                ms, seq = stream_pos(eid)
                if cut is not None and (ms, seq) < cut:
                    break
                if f.get("type") != "enqueued" or not f.get("tid"):
                    continue
                for idx, tid in enumerate(f["tid"].split(" ")):
                    pos = (ms, seq, q, idx)
                    if after is None or pos < after:
                        cands.append((pos, tid))
        cands.sort(reverse=True)
        # Records are read in batches, newest first, only as far as the page needs them
        # (a round's candidates can run to hundreds of thousands: bulk entries hold 250 tids).
        done = 0
        while done < len(cands):
            if fetched >= RECORD_BUDGET:  # resume after the last one read, mid-entry or not
                return items, make_cursor(cands[done - 1][0]), read
            n = min(max(limit - len(items), FETCH_MIN), RECORD_BUDGET - fetched)
            batch = cands[done : done + n]
            done += len(batch)
            fetched += len(batch)
            recs = await records(r, [keys.queue(pos[2]).task(tid) for pos, tid in batch])
            for (pos, tid), rec in zip(batch, recs, strict=True):
                full_id = make_task_id(pos[2], tid)
                info = task_info(pos[2], tid, rec, status=status, name=name)
                if info is None or full_id in seen:  # (seen: enqueued again, its record kept)
                    continue
                seen.add(full_id)
                items.append(info.to_dict())
                if len(items) >= limit:
                    return items, make_cursor(pos), read
        if cut is None:
            return items, None, read
        # Everything at or above the cut is listed: go on below it (the queue name sorts
        # after "" so a (ms, seq, "") position excludes the cut's own id in every queue).
        after = (cut[0], cut[1], "", 0)
        upper = f"{cut[0]}-{cut[1]}"
        if fetched >= RECORD_BUDGET:
            break
    assert after is not None
    return items, make_cursor(after), read


async def running(
    r: aredis.Redis, keys: Keys, queues: Sequence[str], *, name: str | None
) -> list[dict[str, Any]]:
    """The tasks being run now: the pending entries of each queue's consumer group (at most
    ``RUNNING_MAX``), most recently delivered first."""
    found: list[tuple[int, str, str, str]] = []  # (idle ms, queue, stream, entry id)
    for q in queues:
        qk = keys.queue(q)
        async with r.pipeline(transaction=False) as pipe:
            for s in qk.streams:
                pipe.xpending_range(s, GROUP, min="-", max="+", count=RUNNING_MAX)
            res = await pipe.execute(raise_on_error=False)
        for s, pend in zip(qk.streams, res, strict=True):
            if isinstance(pend, Exception):
                continue  # no group yet: nothing delivered
            found += [(int(p["time_since_delivered"]), q, s, p["message_id"]) for p in pend]
    found.sort()
    found = found[:RUNNING_MAX]
    entries = await pipelined(r, found, lambda p, f: p.xrange(f[2], min=f[3], max=f[3], count=1))
    tids: list[tuple[str, str]] = []
    for (_, q, _, _), entry in zip(found, entries, strict=True):
        if entry and entry[0][1].get("t"):
            tids.append((q, entry[0][1]["t"]))
    recs = await records(r, [keys.queue(q).task(tid) for q, tid in tids])
    return [
        info.to_dict()
        for (q, tid), rec in zip(tids, recs, strict=True)
        if (info := task_info(q, tid, rec, status="running", name=name))
    ]
