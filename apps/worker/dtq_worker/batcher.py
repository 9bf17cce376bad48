"""Group commit: outcome writes that arrive while one is in flight go out together."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class Batcher(Generic[I, O]):
    """``submit`` returns the item's own result; ``flush`` sends a whole batch in one call: up to
    ``flights`` at once, each of at most ``max_batch`` items (0: no limit)."""

    def __init__(
        self,
        flush: Callable[[Sequence[I]], Awaitable[Sequence[O]]],
        *,
        max_batch: int = 0,
        flights: int = 1,
    ) -> None:
        self._flush = flush
        self._pending: list[tuple[I, asyncio.Future[O]]] = []
        self._max_batch = max_batch
        self._flights = flights
        self._busy = 0
        self._ctx = contextvars.copy_context()

    async def submit(self, item: I) -> O:
        fut: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._busy < self._flights:
            self._busy += 1
            # (in the worker's context: the submitter is a run, whose variables stay its own)
            asyncio.get_running_loop().create_task(self._drain(), context=self._ctx.copy())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                mb = self._max_batch
                if mb and len(self._pending) > mb:
                    batch, self._pending = self._pending[:mb], self._pending[mb:]
                else:
                    batch, self._pending = self._pending, []
                try:
                    results = await self._flush([i for i, _ in batch])
                except BaseException as exc:
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, f), r in zip(batch, results, strict=True):
                    if not f.done():
                        f.set_result(r)
        finally:
            self._busy -= 1
