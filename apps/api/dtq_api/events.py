"""Server-sent event streams: many subscribers, one Redis reader.

One :class:`EventHub` per process reads the event streams on its own connection (its own
:class:`~dtq.admin.Admin`), so open dashboards never take the routes' pool, and hands each batch
to every subscriber's bounded queue. Past ``DTQ_API_MAX_STREAMS`` subscribers a stream is
refused; one that does not keep up (its queue full) is dropped with an ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator

import redis

from dtq.admin import Admin, Event
from dtq.admin.common import stream_pos
from dtq.aiotasks import cancel_until_done
from dtq.errors import RedisUnavailable
from dtq.settings import Settings
from dtq.store.connection import async_redis

log = logging.getLogger("dtq.api")
BLOCK_MS = 5000
READER_END_S = 5.0
"""How long :meth:`EventHub.close` waits for its reader to end."""
QUEUE_BATCHES = 256
"""Batches a subscriber may have unread before it is dropped as too slow."""


class TooManyStreams(Exception):
    """The process already serves ``DTQ_API_MAX_STREAMS`` event streams."""


class Subscription:
    """One stream's place in the hub; :meth:`close` frees it (idempotent)."""

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub
        self.queue: asyncio.Queue[list[Event] | str] = asyncio.Queue(QUEUE_BATCHES)
        self.closed = False

    async def ready(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until the hub's reader has fixed where the streams stand:
        from then on every new event reaches this subscriber. Past the timeout (Redis down)
        the stream goes on; the reader's error reaches it as an event."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hub._positioned.wait(), timeout_s)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._hub._subs.discard(self)


class EventHub:
    """Fans one reader's events out to up to ``max_streams`` subscribers."""

    def __init__(self, make_admin: Callable[[], Admin], max_streams: int) -> None:
        self._make_admin = make_admin
        self.max_streams = max_streams
        self._subs: set[Subscription] = set()
        self._reader: asyncio.Task[None] | None = None
        self._admin: Admin | None = None
        # Set once the running reader knows every stream's position (a subscriber says
        # "connected" only after that, so no event between the two is missed).
        self._positioned = asyncio.Event()

    @property
    def streams(self) -> int:
        return len(self._subs)

    def subscribe(self) -> Subscription:
        if len(self._subs) >= self.max_streams:
            raise TooManyStreams(f"{self.max_streams} event streams already open")
        sub = Subscription(self)
        self._subs.add(sub)
        if self._reader is None or self._reader.done():
            self._positioned.clear()
            self._reader = asyncio.get_running_loop().create_task(self._read())
        return sub

    async def close(self) -> None:
        for sub in list(self._subs):
            sub.close()
        if self._reader is not None:
            # Cancelled again until it ends: a redis-py read can lose a cancel (dtq/aiotasks.py).
            if await cancel_until_done([self._reader], READER_END_S):
                log.warning("the event reader did not end within %.0fs", READER_END_S)
            elif not self._reader.cancelled():
                with contextlib.suppress(Exception):
                    self._reader.result()  # (its error, if any, was delivered to the streams)
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    def _deliver(self, item: list[Event] | str) -> None:
        for sub in list(self._subs):
            try:
                sub.queue.put_nowait(item)
            except asyncio.QueueFull:
                # The stream ends once its reader has drained what it holds.
                log.warning("event stream dropped: client too slow")
                sub.close()

    async def _read(self) -> None:
        if self._admin is None:
            self._admin = self._make_admin()
        cursors: dict[str, str] | None = None
        while self._subs:
            try:
                if cursors is None:
                    cursors = await self._admin.event_cursors()
                    self._positioned.set()
                evs, cursors = await self._admin.read_events(cursors, block_ms=BLOCK_MS)
            except (RedisUnavailable, redis.RedisError, OSError) as exc:
                self._deliver(str(exc))
                await asyncio.sleep(1.0)
                continue
            if evs:
                self._deliver(evs)


# SSE frames are written by hand: sse-starlette's costs more per event (docs/performance.md,
# "Hand-written code"), and its EventSourceResponse would replace this stream's slow-client cut
# and idle ping with its own.
def _error(message: str) -> bytes:
    return f"event: error\ndata: {json.dumps({'message': message})}\n\n".encode()


def _frame(e: Event, last_of_entry: bool = True) -> bytes:
    """One message. Only the last event of a stream entry carries its id (an entry can hold
    several events, see dtq.admin.views.events_from): a client that drops mid-entry resumes
    from the entry before and gets the whole entry again instead of losing its other events."""
    data = f"data: {json.dumps(e.to_dict())}\n\n"
    return (f"id: {e.id}\n{data}" if last_of_entry else data).encode()


def _frames(events: list[Event]) -> Iterator[tuple[Event, bytes]]:
    """Each event with its message (see :func:`_frame`)."""
    for e, nxt in zip(events, [*events[1:], None], strict=True):
        yield e, _frame(e, nxt is None or (nxt.stream, nxt.id) != (e.stream, e.id))


Backlog = AsyncIterator[tuple[list[Event], bool]]
"""A resumed stream's missed events in pages, each with whether more were left out
(:meth:`dtq.admin.Admin.resume_pages`)."""


async def sse(
    sub: Subscription, ping_s: float, backlog: Backlog | None = None
) -> AsyncIterator[bytes]:
    """The bytes of one stream: a greeting, events, a comment every ``ping_s`` when idle.

    ``backlog`` (a resumed stream's missed events, read after ``sub`` subscribed) goes first,
    page by page; live events it already holds are then skipped, per stream, so none repeats.
    """
    last: dict[str, tuple[int, int]] = {}
    try:
        await sub.ready(ping_s)
        yield b": connected\n\n"
        if backlog is not None:
            try:
                async for page, more in backlog:
                    for e, frame in _frames(page):
                        last[e.stream] = max(last.get(e.stream, (0, 0)), stream_pos(e.id))
                        yield frame
                    if more:
                        yield _error("too many missed events; some are left out")
            except (RedisUnavailable, redis.RedisError, OSError) as exc:
                yield _error(f"missed events not all read: {exc}")
        while True:
            if sub.closed and sub.queue.empty():
                yield _error("client too slow; reconnect")
                return
            try:
                item = await asyncio.wait_for(sub.queue.get(), ping_s)
            except TimeoutError:
                yield b": ping\n\n"
                continue
            if isinstance(item, str):
                yield _error(item)
                continue
            for e, frame in _frames(item):
                if last and e.stream in last and stream_pos(e.id) <= last[e.stream]:
                    continue  # already sent from the backlog
                yield frame
    finally:
        sub.close()


# The hub's own client may hold this many connections (per node): on a cluster its reader holds
# one blocking XREAD per queue (dtq/admin/events.py), and a cap would hold some reads back.
READER_CONNECTIONS = 100_000


def hub_admin(settings: Settings) -> Admin:
    """The hub's Admin, on a client of its own (outside the routes' pool)."""
    r = async_redis(
        settings.redis_url,
        retries=settings.client_retries,
        decode_responses=True,
        max_connections=READER_CONNECTIONS,
    )
    return Admin(settings, redis_client=r)


def hub_for(settings: Settings, max_streams: int) -> EventHub:
    """The process's hub, reading through :func:`hub_admin`."""
    return EventHub(lambda: hub_admin(settings), max_streams)
