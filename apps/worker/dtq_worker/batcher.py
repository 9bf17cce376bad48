"""Group commit: outcome writes that arrive while one is in flight go out together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class Batcher(Generic[I, O]):
    """``submit`` returns the item's own result; ``flush`` sends a whole batch in one call."""

    def __init__(self, flush: Callable[[Sequence[I]], Awaitable[Sequence[O]]]) -> None:
        self._flush = flush
        self._pending: list[tuple[I, asyncio.Future[O]]] = []
        self._busy = False

    async def submit(self, item: I) -> O:
        fut: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
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
            self._busy = False
