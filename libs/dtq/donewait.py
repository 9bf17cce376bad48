"""One pub/sub connection for all of an AsyncClient's ``result()`` waits.

A waiting ``result()`` used to hold a pub/sub connection of its own from redis-py's pool (100
connections) and take a second one for each ``get``: past about 50 waits at once the pool ran out
and ``result()`` raised :class:`dtq.RedisUnavailable`. Here every wait of one client shares one
subscribed connection, read by one task that wakes the waits of the channel a message names;
a channel is subscribed while at least one wait needs it.

A wait is woken, never told the outcome: ``result()`` reads the record after each wake-up and at
least every 5 s, so a message lost (the connection dropped and was made again, which redis-py
follows by subscribing the channels again) costs time, never a result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger("dtq.client")

CONFIRM_S = 5.0  # a subscription not confirmed by then is waited on anyway (the 5 s poll holds)
IDLE_READ_S = 1.0  # the reader's read timeout: it ends once no channel has been wanted that long


class DoneWaits:
    """``ev = await add(channel)``: an event set on each message of ``channel``, once Redis has
    confirmed the subscription; ``await remove(channel, ev)`` when done with it."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._ps: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._events: dict[str, set[asyncio.Event]] = {}
        self._ready: dict[str, asyncio.Future[None]] = {}  # channel -> subscription confirmed
        self._sending = asyncio.Lock()

    async def add(self, channel: str) -> asyncio.Event:
        ev = asyncio.Event()
        evs = self._events.get(channel)
        if evs is None:
            evs = self._events[channel] = set()
            ready = self._ready[channel] = asyncio.get_running_loop().create_future()
            evs.add(ev)
            try:
                if self._ps is None:
                    self._ps = self._redis.pubsub()
                # One at a time: each SUBSCRIBE sent while the connection was not yet made would
                # make one of its own (and all but the last leak out of the pool).
                async with self._sending:
                    await self._ps.subscribe(channel)  # (the reader reads its confirmation)
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.get_running_loop().create_task(self._read())
            except BaseException:
                await self.remove(channel, ev)
                raise
        else:
            evs.add(ev)
            ready = self._ready[channel]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(ready), CONFIRM_S)
        return ev

    async def remove(self, channel: str, ev: asyncio.Event) -> None:
        evs = self._events.get(channel)
        if evs is None:
            return
        evs.discard(ev)
        if evs:
            return
        del self._events[channel]
        ready = self._ready.pop(channel)
        if not ready.done():
            ready.cancel()
        with contextlib.suppress(Exception):  # (down: redis-py drops it when it reconnects)
            async with self._sending:
                await self._ps.unsubscribe(channel)

    async def _read(self) -> None:
        """Wake the waits of each message's channel; resolve confirmations. Ends when no
        channel is wanted; on a connection error it backs off and reads again (redis-py
        reconnects and subscribes the channels again)."""
        delay = 0.05
        while True:
            try:
                msg = await self._ps.get_message(timeout=IDLE_READ_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("result() subscription read failed: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.05
            if msg is None:
                if not self._events:
                    return
                continue
            channel = msg.get("channel")
            if isinstance(channel, bytes):
                channel = channel.decode()
            if msg.get("type") == "subscribe":
                ready = self._ready.get(channel)
                if ready is not None and not ready.done():
                    ready.set_result(None)
            elif msg.get("type") == "message":
                for ev in self._events.get(channel, ()):
                    ev.set()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._ps is not None:
            with contextlib.suppress(Exception):
                await self._ps.aclose()
            self._ps = None
