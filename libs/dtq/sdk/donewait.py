"""One pub/sub connection for all of a client's ``result()`` waits (AsyncClient: DoneWaits;
the blocking Client: SyncDoneWaits, whose one reader thread is woken by a PUBLISH on the client's
wake channel). A wait is woken, never told the outcome: ``result()`` reads the record after each
wake-up. On a cluster the waits SSUBSCRIBE at the channel's node (docs/faults.md, "Redis
Cluster"), read in turns of :data:`CLUSTER_READ_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from dtq.scripts import to_str
from dtq.sdk import forkreset
from dtq.store.connection import is_cluster

log = logging.getLogger("dtq.sdk.client")

CONFIRM_S = 5.0  # a subscription not confirmed by then is waited on anyway (the 5 s poll holds)
IDLE_READ_S = 1.0  # the reader's read timeout: it ends once no channel has been wanted that long
CLUSTER_READ_S = 0.05  # the read timeout on a cluster (see above)


class _Sub:
    """A PubSub's calls for done channels: SUBSCRIBE, or SSUBSCRIBE on a cluster."""

    def __init__(self, ps: Any, sharded: bool) -> None:
        self.ps = ps
        self.sharded = sharded
        self.subscribe = ps.ssubscribe if sharded else ps.subscribe
        self.unsubscribe = ps.sunsubscribe if sharded else ps.unsubscribe
        self.confirm, self.message = (
            ("ssubscribe", "smessage") if sharded else ("subscribe", "message")
        )
        self.timeout = CLUSTER_READ_S if sharded else IDLE_READ_S

    def parse(self, msg: dict[str, Any]) -> tuple[bool | None, str]:
        """Whether ``msg`` confirms a subscription (True), announces an end (False) or neither
        (None); and its channel."""
        kind, channel = msg.get("type"), to_str(msg.get("channel"))
        return (True if kind == self.confirm else False if kind == self.message else None), channel

    def read(self) -> Any:
        """The next message (an awaitable for an asyncio PubSub), None after the timeout."""
        if self.sharded:
            return self.ps.get_sharded_message(timeout=self.timeout)
        return self.ps.get_message(timeout=self.timeout)


class DoneWaits:
    """``ev = await add(channel)``: an event set on each message of ``channel``, once Redis has
    confirmed the subscription; ``await remove(channel, ev)`` when done with it."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._ps: _Sub | None = None
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
                    self._ps = _Sub(self._redis.pubsub(), is_cluster(self._redis))
                # One at a time: SUBSCRIBEs sent before the connection is made would each make one.
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
                assert self._ps is not None  # (made by the add() of the channel)
                await self._ps.unsubscribe(channel)

    async def _read(self) -> None:
        """Wake the waits of each message's channel; resolve confirmations. Ends when no
        channel is wanted; backs off on a connection error (redis-py subscribes again)."""
        delay = 0.05
        sub = self._ps
        assert sub is not None  # (made before the reader)
        while True:
            try:
                msg = await sub.read()
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
            confirmed, channel = sub.parse(msg)
            if confirmed:
                ready = self._ready.get(channel)
                if ready is not None and not ready.done():
                    ready.set_result(None)
            elif confirmed is False:
                for ev in self._events.get(channel, ()):
                    ev.set()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._ps is not None:
            with contextlib.suppress(Exception):
                await self._ps.ps.aclose()
            self._ps = None


class SyncDoneWaits:
    """:class:`DoneWaits` for threads: the reader thread alone touches the PubSub."""

    def __init__(self, redis: Any, wake_channel: Callable[[str], str]) -> None:
        """``wake_channel(token)``: the name of this client's wake channel (Keys.wake_channel)."""
        self._redis = redis
        self._wake_of = wake_channel
        self._sharded = is_cluster(redis)  # (no wake channel then: see the module's doc)
        self._reset()
        forkreset.track(self)

    def _reset(self) -> None:
        self._wake = self._wake_of(secrets.token_hex(8))
        self._lock = threading.Lock()  # guards everything below
        self._events: dict[str, set[threading.Event]] = {}
        self._ready: dict[str, threading.Event] = {}  # channel -> subscription confirmed
        self._failed: dict[str, Exception] = {}  # channel -> why its subscription failed
        self._todo: set[str] = set()  # channels wanted or given up since the reader last looked
        self._reader: threading.Thread | None = None
        self._closed = False

    def add(self, channel: str) -> threading.Event:
        """Raises what the subscription met (Redis down, say), as DoneWaits.add does."""
        ev = threading.Event()
        with self._lock:
            evs = self._events.get(channel)
            if evs is not None:
                evs.add(ev)
                ready, wake = self._ready[channel], False
            else:
                self._events[channel] = {ev}
                ready = self._ready[channel] = threading.Event()
                self._todo.add(channel)
                wake = self._reader is not None  # (a new reader looks at _todo first)
                if not wake:
                    self._reader = threading.Thread(
                        target=self._read, name="dtq-result-waits", daemon=True
                    )
                    self._reader.start()
                wake = wake and not self._sharded  # (a cluster's reader: after its short read)
        try:
            if wake:  # the reader may be blocked in its read
                self._redis.publish(self._wake, "")
            ready.wait(CONFIRM_S)
            with self._lock:
                failed = self._failed.get(channel)
            if failed is not None:
                raise failed
        except BaseException:
            self.remove(channel, ev)
            raise
        return ev

    def remove(self, channel: str, ev: threading.Event) -> None:
        with self._lock:
            evs = self._events.get(channel)
            if evs is None:
                return
            evs.discard(ev)
            if not evs:
                del self._events[channel]
                del self._ready[channel]
                self._failed.pop(channel, None)
                self._todo.add(channel)  # (unsubscribed at the reader's next turn)

    def _turn(self, subscribed: set[str], idle: bool) -> tuple[list[str], list[str]] | None:
        """Under the lock: the channels to subscribe and to unsubscribe now; None: the reader
        ends (closed, or nothing wanted after an idle turn)."""
        if self._closed or (idle and not self._events and not self._todo):
            self._reader = None
            return None
        todo, self._todo = self._todo, set()
        add = [c for c in todo if c in self._events and c not in subscribed]
        drop = [c for c in todo if c not in self._events and c in subscribed]
        return add, drop

    def _read(self) -> None:  # the reader thread
        sub = _Sub(self._redis.pubsub(), self._sharded)
        subscribed: set[str] = set()
        idle, delay = False, 0.05
        try:
            while True:
                with self._lock:
                    turn = self._turn(subscribed, idle)
                if turn is None:
                    return
                add, drop = turn
                try:
                    if not self._sharded and self._wake not in subscribed:
                        sub.subscribe(self._wake)
                        subscribed.add(self._wake)
                    if add:
                        sub.subscribe(*add)
                        subscribed.update(add)
                    if drop:
                        sub.unsubscribe(*drop)
                        subscribed.difference_update(drop)
                    msg = sub.read()
                except Exception as exc:
                    log.debug("result() subscription failed: %s", exc)
                    self._fail(add, drop, exc)
                    subscribed.difference_update(add)
                    idle = True
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                delay = 0.05
                idle = msg is None
                if msg is not None:
                    self._deliver(sub, msg)
        finally:
            with contextlib.suppress(Exception):
                sub.ps.close()

    def _fail(self, add: list[str], drop: list[str], exc: Exception) -> None:
        """The waits of the channels just asked for raise ``exc``; those channels are asked for
        (or given up) again on the next turn."""
        with self._lock:
            for c in add:
                if c in self._ready:
                    self._failed[c] = exc
                    self._ready[c].set()
            self._todo.update(add)
            self._todo.update(drop)

    def _deliver(self, sub: _Sub, msg: dict[str, Any]) -> None:
        confirmed, channel = sub.parse(msg)
        with self._lock:
            if confirmed:
                ready = self._ready.get(channel)
                if ready is not None:
                    self._failed.pop(channel, None)
                    ready.set()
            elif confirmed is False:
                for ev in self._events.get(channel, ()):
                    ev.set()

    def close(self) -> None:
        """Ends the reader (woken, so at once when Redis answers)."""
        with self._lock:
            self._closed = True
            reader = self._reader
        if reader is not None:
            if not self._sharded:  # (a cluster's reader sees it after its short read)
                with contextlib.suppress(Exception):
                    self._redis.publish(self._wake, "")
            reader.join(IDLE_READ_S + 1.0)
