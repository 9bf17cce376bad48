"""Group commit for a client's calls: concurrent calls of one key go out as one batch.

A call of an idle key is sent at once by its caller; calls made while it is in flight go out
together when it returns (docs/client.md, "Many coroutines enqueueing at once"). A waiter
cancelled before its batch is sent is left out of it; a failed batch raises in each waiter."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from dtq.errors import BatchInterrupted
from dtq.sdk import forkreset

K = TypeVar("K")
I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

# Set while a coroutine sends a call or a batch: a call it makes meanwhile (dtq.testing's eager
# mode) goes out on its own, as it cannot wait for the send it is part of.
_SENDING: contextvars.ContextVar[bool] = contextvars.ContextVar("dtq_sending", default=False)


class Coalescer(Generic[K, I, O]):
    """``await c.call(key, item, send_one)``: ``send_one()``'s result when ``key`` is idle (or
    when called inside a send, which cannot wait for itself), else ``item``'s result from the
    next ``send_many(key, items)``."""

    def __init__(self, send_many: Callable[[K, Sequence[I]], Awaitable[Sequence[O]]]) -> None:
        self._send_many = send_many
        self._waiting: dict[K, list[tuple[I, asyncio.Future[O]]]] = {}  # key: one in flight
        self._batches: set[asyncio.Task[None]] = set()

    async def call(self, key: K, item: I, send_one: Callable[[], Awaitable[O]]) -> O:
        if _SENDING.get():
            return await send_one()
        waiting = self._waiting.get(key)
        if waiting is not None:  # a call of key in flight: item goes in the batch after it
            fut: asyncio.Future[O] = asyncio.get_running_loop().create_future()
            waiting.append((item, fut))
            return await fut
        self._waiting[key] = []
        token = _SENDING.set(True)
        try:
            return await send_one()
        finally:
            _SENDING.reset(token)
            self._next(key)

    def _next(self, key: K) -> None:
        """The call of ``key`` in flight ended: send what waited for it, as one batch."""
        batch = [w for w in self._waiting.pop(key) if not w[1].done()]  # (done: cancelled)
        if batch:
            self._waiting[key] = []
            t = asyncio.get_running_loop().create_task(self._batch(key, batch))
            self._batches.add(t)
            t.add_done_callback(self._batches.discard)

    async def _batch(self, key: K, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        _SENDING.set(True)  # (this task's own context)
        try:
            out = await self._send_many(key, [item for item, _ in batch])
        except Exception as exc:
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc)
        except BaseException:  # (cancelled: the client closes or the loop ends)
            for _, f in batch:
                f.cancel()
            raise
        else:
            for (_, f), o in zip(batch, out, strict=True):
                if not f.done():
                    f.set_result(o)
        finally:
            self._next(key)

    async def drain(self) -> None:
        """Wait until no batch is in flight (those sent while waiting included)."""
        while self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)


class _Place(Generic[I, O]):
    """One thread's item waiting for the call of its key in flight."""

    __slots__ = ("batch", "done", "error", "item", "result")

    def __init__(self, item: I) -> None:
        self.item = item
        self.done = threading.Event()  # set when answered, or when this thread is to send
        self.batch: list[_Place[I, O]] | None = None  # the items this thread sends, if any
        self.result: Any = None
        self.error: BaseException | None = None


class SyncCoalescer(Generic[K, I, O]):
    """:class:`Coalescer` for threads: the oldest waiting caller sends the batch.

    ``c.call(key, item, send_one)``: ``send_one()``'s result when the key was idle, else the
    item's result from a batch. If the sending thread is interrupted, each other caller sends
    its item again with ``send_one``, which must be safe to repeat (an enqueue's is).
    """

    def __init__(self, send_many: Callable[[K, Sequence[I]], Sequence[O]]) -> None:
        self._send_many = send_many
        self._lock = threading.Lock()
        self._waiting: dict[K, list[_Place[I, O]]] = {}  # key: one in flight
        forkreset.track(self)

    def call(self, key: K, item: I, send_one: Callable[[], O]) -> O:
        if getattr(_SENDER, "on", False):  # made inside this thread's send: it cannot wait
            return send_one()
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is None:
                self._waiting[key] = []
            else:
                place: _Place[I, O] = _Place(item)
                waiting.append(place)
        if waiting is None:
            _SENDER.on = True
            try:
                return send_one()
            finally:
                _SENDER.on = False
                self._next(key)
        try:
            place.done.wait()
        except BaseException:  # (KeyboardInterrupt in the main thread, while it waited)
            self._abandon(key, place)
            raise
        if place.batch is not None:
            self._send(key, place.batch)
        if isinstance(place.error, BatchInterrupted):
            return send_one()  # reached Redis or not: repeated alone (see above)
        if place.error is not None:
            raise place.error
        return place.result  # type: ignore[no-any-return]

    def _next(self, key: K) -> None:
        """The call of ``key`` in flight ended: the oldest waiter is to send what waited."""
        with self._lock:
            # (None: a fork reset this child's calls while its forking thread was sending)
            waiting = self._waiting.pop(key, None)
            if waiting:
                self._waiting[key] = []
                waiting[0].batch = waiting
        if waiting:
            waiting[0].done.set()

    def _abandon(self, key: K, place: _Place[I, O]) -> None:
        """A waiter interrupted: its item is left out unless its batch was taken already; if
        it was to send its batch, it sends it still (the others wait for that)."""
        with self._lock:
            batch = place.batch
            waiting = self._waiting.get(key)
            if batch is None and waiting is not None and place in waiting:
                waiting.remove(place)
        if batch is not None:
            self._send(key, batch)

    def _send(self, key: K, batch: list[_Place[I, O]]) -> None:
        _SENDER.on = True
        try:
            out = self._send_many(key, [p.item for p in batch])
            for p, o in zip(batch, out, strict=True):
                p.result = o
        except BaseException as exc:  # (each caller raises it; an interrupt is this thread's)
            other = exc if isinstance(exc, Exception) else _interrupted(exc)
            for p in batch:
                p.error = other
            batch[0].error = exc  # (this thread's place: it was the oldest waiter)
        finally:
            _SENDER.on = False
            self._next(key)
            for p in batch[1:]:
                p.done.set()

    def _reset(self) -> None:
        """In a forked child: the calls in flight stayed in the parent (their threads did)."""
        self._lock = threading.Lock()
        self._waiting = {}


def _interrupted(exc: BaseException) -> BatchInterrupted:
    return BatchInterrupted(
        f"the thread sending this call's batch was interrupted ({type(exc).__name__}) while "
        "it was in flight: whether the batch reached Redis is unknown"
    )


_SENDER = threading.local()  # .on: this thread is sending a call or a batch (see _SENDING)
