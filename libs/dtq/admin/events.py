"""Admin's reads of the event streams: recent, live (blocking), after an id, throughput."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from dtq.admin.common import id_ms, stream_pos
from dtq.admin.core import AdminCore
from dtq.admin.views import Event, events_from, iso
from dtq.aiotasks import cancel_until_done
from dtq.errors import InvalidRequest
from dtq.store.partitions import expand

# How long close() waits for the cluster's per-stream reads to end (dtq/aiotasks.py).
STRAY_READ_WAIT_S = 1.0
RESUME_PAGE = 100
"""Entries of one event stream a resumed stream (Last-Event-ID) reads at a time."""


def _take_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # taken: asyncio has no error to report when the task is freed


class EventOps(AdminCore):
    """The queues' and the workers' event streams."""

    def _event_keys(self, queues: Sequence[str]) -> dict[str, str]:
        keys = {self.keys.queue(q).events: q for q in queues}
        keys[self.keys.worker_events] = "@workers"
        return keys

    async def recent_events(
        self, *, queues: Sequence[str] | None = None, since_ms: int | None = None, limit: int = 1000
    ) -> list[Event]:
        """Events newer than ``since_ms`` (default: the last ``limit`` of each stream)."""
        parts = self.settings.queue_partitions
        qs = await self.physical_names() if queues is None else expand(queues, parts)
        lo = "-" if since_ms is None else str(since_ms)
        out: list[Event] = []
        for key, stream in self._event_keys(qs).items():
            entries = await self._r.xrevrange(key, max="+", min=lo, count=limit)
            for eid, f in entries:
                out.extend(events_from(stream, eid, f))
        out.sort(key=lambda e: (e.ts_ms, e.id))
        return out

    async def event_cursors(self) -> dict[str, str]:
        """Every event stream's position now: :meth:`read_events` from these returns exactly
        the events appended after this call ("$" cannot be kept between calls)."""
        cur: dict[str, str] = {}
        for k in self._event_keys(await self.physical_names()):
            last = await self._r.xrevrange(k, count=1)
            cur[k] = last[0][0] if last else "0-0"
        return cur

    async def read_events(
        self, cursors: dict[str, str] | None, *, block_ms: int = 5000, count: int = 500
    ) -> tuple[list[Event], dict[str, str]]:
        """Wait up to ``block_ms`` for new events on every queue's stream and the workers'.

        ``cursors`` maps stream keys to the last id seen (None: start from now). Returns the
        events and the cursors to pass next time; queues that appear later are picked up.
        """
        if cursors is None:
            cursors = await self.event_cursors()
        keys = self._event_keys(await self.physical_names())
        cur = {**dict.fromkeys(keys, "0-0"), **cursors}  # a queue new mid-stream: from its start
        if self._cluster:
            res = await self._xread_each(keys, cur, count, block_ms)
        else:
            res = await self._r.xread(
                {k: cur[k] for k in keys}, count=count, block=block_ms or None
            )
        events: list[Event] = []
        for key, entries in res or []:
            for eid, f in entries:
                events.extend(events_from(keys[key], eid, f))
                cur[key] = eid
        events.sort(key=lambda e: (e.ts_ms, e.id))
        return events, cur

    async def _xread_each(
        self, keys: Collection[str], cur: dict[str, str], count: int, block_ms: int
    ) -> list[Any]:
        """On a cluster, where one XREAD cannot span the queues' slots: one XREAD per stream,
        in parallel, until the first has events or fails (its error is raised). Reads still
        waiting are kept for the next call, not cancelled (a cancel can be lost:
        dtq/aiotasks.py); :meth:`close` ends them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_ms / 1000
        reads = self._stream_reads
        while True:
            left_ms = max(1, int((deadline - loop.time()) * 1000))
            for k in keys:
                kept = reads.get(k)
                if kept is not None and kept[0] != cur[k]:
                    kept[1].cancel()  # reads from an older position: not what is asked
                    self._dropped_reads.add(kept[1])
                    kept[1].add_done_callback(self._dropped_reads.discard)
                    kept = None
                if kept is None:
                    block = left_ms if block_ms else None
                    t = asyncio.ensure_future(self._r.xread({k: cur[k]}, count=count, block=block))
                    t.add_done_callback(_take_outcome)
                    reads[k] = (cur[k], t)
            await asyncio.wait({reads[k][1] for k in keys}, return_when=asyncio.FIRST_COMPLETED)
            out: list[Any] = []
            error: BaseException | None = None
            for k in keys:
                t = reads[k][1]
                if t.done():
                    del reads[k]
                    if not t.cancelled():
                        error = error or t.exception()
                        out.extend([] if t.exception() else t.result() or [])
            if error is not None:
                raise error  # (events read meanwhile are read again from the same cursors)
            if out or not block_ms or loop.time() >= deadline:
                return out

    @functools.cached_property
    def _stream_reads(self) -> dict[str, tuple[str, asyncio.Task[Any]]]:
        """The cluster's per-stream XREADs under way: stream key -> (its cursor, the read)."""
        return {}

    @functools.cached_property
    def _dropped_reads(self) -> set[asyncio.Task[Any]]:
        """Reads cancelled for an older cursor that have not ended yet."""
        return set()

    async def close(self) -> None:
        reads = [t for _, t in self._stream_reads.values()] + list(self._dropped_reads)
        self._stream_reads.clear()
        for t in reads:
            t.cancel()
        await super().close()
        if reads:
            await cancel_until_done(reads, STRAY_READ_WAIT_S)

    async def events_after(self, last_id: str, limit: int = 5000) -> tuple[list[Event], bool]:
        """Events of every stream after stream id ``last_id``, oldest first, at most ``limit``;
        the flag says whether more were left out (see :meth:`resume_pages`)."""
        pages = [p async for p in self.resume_pages(last_id, limit)]  # (at least one)
        return [e for page, _ in pages for e in page], pages[-1][1]

    async def resume_pages(  # long: one merge loop, its state local
        self, last_id: str, limit: int = 5000
    ) -> AsyncIterator[tuple[list[Event], bool]]:
        """Events of every stream after stream id ``last_id`` (a client's ``Last-Event-ID``),
        oldest first, at most ``limit``, in pages, each with whether more were left out.

        Streams are merged ``RESUME_PAGE`` entries at a time, so a resume reads about what it
        sends; the cut falls between entries (a client resumes after a whole entry). Ids are
        per stream: another stream's events in ``last_id``'s millisecond may repeat or miss.
        """
        keys = list(self._event_keys(await self.physical_names()).items())
        bufs: list[list[tuple[str, dict[str, str]]]] = [[] for _ in keys]
        at = ["(" + last_id] * len(keys)
        ended = [False] * len(keys)
        heads = [0] * len(keys)
        sent = 0
        page: list[Event] = []

        async def fill(idx: list[int]) -> None:
            async with self._r.pipeline(transaction=False) as pipe:
                for i in idx:
                    pipe.xrange(keys[i][0], min=at[i], max="+", count=RESUME_PAGE)
                for i, chunk in zip(idx, await pipe.execute(), strict=True):
                    bufs[i], heads[i] = chunk, 0
                    ended[i] = len(chunk) < RESUME_PAGE
                    if chunk:
                        at[i] = "(" + chunk[-1][0]

        await fill(list(range(len(keys))))
        while True:
            best = -1
            best_key = (0, 0)
            for i, buf in enumerate(bufs):
                if heads[i] < len(buf):
                    k = stream_pos(buf[heads[i]][0])
                    if best < 0 or k < best_key:
                        best, best_key = i, k
            if best < 0:
                yield page, False
                return
            eid, f = bufs[best][heads[best]]
            evs = events_from(keys[best][1], eid, f)
            if sent + len(evs) > limit:
                yield page, True
                return
            heads[best] += 1
            sent += len(evs)
            page += evs
            if heads[best] == len(bufs[best]) and not ended[best]:
                yield page, False
                page = []
                await fill([best])
                await asyncio.sleep(0)  # the loop's turn (a page read may not give one)

    async def throughput(self, *, window_s: int = 600, bucket_s: int = 10) -> dict[str, Any]:
        """Finished runs per time bucket over the last ``window_s`` seconds, from the events.

        Bounded by the event streams' caps (``DTQ_EVENTS_MAXLEN`` per queue).
        """
        if not (bucket_s >= 1 and 1 <= window_s <= 86_400):
            raise InvalidRequest("need bucket_s >= 1 and 1 <= window_s <= 86400")
        bucket_s = min(bucket_s, window_s)
        now_ms = int(time.time() * 1000)
        start = now_ms - window_s * 1000
        start -= start % (bucket_s * 1000)
        n = (now_ms - start) // (bucket_s * 1000) + 1
        series = {k: [0] * n for k in ("succeeded", "failed", "retried", "enqueued")}
        for q in await self.physical_names():
            key = self.keys.queue(q).events
            lo = str(start)
            while True:
                entries = await self._r.xrange(key, min=lo, max="+", count=5000)
                for eid, f in entries:
                    t = f.get("type")
                    if t in series:  # an entry may hold a batch: one tid per event
                        n_ev = (f.get("tid") or "").count(" ") + 1
                        series[t][(id_ms(eid) - start) // (bucket_s * 1000)] += n_ev
                if len(entries) < 5000:
                    break
                lo = "(" + entries[-1][0]
        return {
            "start": iso(start),
            "bucket_s": bucket_s,
            "buckets": [iso(start + i * bucket_s * 1000) for i in range(n)],
            "series": series,
        }
