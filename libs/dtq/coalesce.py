"""Group commit for an asyncio client's calls: concurrent calls of one key go out as one batch.

A call whose key has nothing in flight is sent at once, from its caller's own coroutine (no task,
no delay: a coroutine enqueueing one task after another pays nothing for this). Calls of that key
made while it is in flight wait; when it returns, all of them go out together in one batch call,
and the calls made while that batch is in flight form the next one. So with many coroutines
enqueueing at once (a web app's handlers) Redis runs a few bulk calls instead of one script call
per task, each waiting at most one round trip longer than its own call would have queued behind
the others' (docs/performance.md, "Single enqueues from many coroutines").

A waiter cancelled before its batch is sent is left out of it (its item is never sent); one
cancelled after is not told what became of its item, as for any call cancelled in flight. A
batch that fails raises its error in each of its waiters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class Coalescer(Generic[K, I, O]):
    """The caller sends a call of an idle key itself, between :meth:`begin` and :meth:`end`;
    while a key is busy, :meth:`wait` returns the item's result from ``send_many(key, items)``
    (a list in the items' order), run with the other items that waited when the call ends.

    ``if c.busy(key): return await c.wait(key, item)``, else ``c.begin(key)``, send, and
    ``c.end(key)`` in a ``finally`` (no closure or task per call on that path).
    """

    def __init__(self, send_many: Callable[[K, Sequence[I]], Awaitable[Sequence[O]]]) -> None:
        self._send_many = send_many
        # key -> the items waiting for the call in flight (the key is present while one is)
        self._waiting: dict[K, list[tuple[I, asyncio.Future[O]]]] = {}
        self._batches: set[asyncio.Task[None]] = set()

    def busy(self, key: K) -> bool:
        return key in self._waiting

    async def wait(self, key: K, item: I) -> O:
        """``item``'s result, sent in the batch after the call of ``key`` in flight."""
        fut: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._waiting[key].append((item, fut))
        return await fut

    def begin(self, key: K) -> None:
        """The caller sends a call of ``key`` (idle) now: later items of ``key`` wait."""
        self._waiting[key] = []

    def end(self, key: K) -> None:
        """The call of ``key`` that :meth:`begin` announced ended (answered or not)."""
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
