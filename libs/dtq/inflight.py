"""A cap on a cluster client's calls in flight, commands and pipelines alike.

redis-py's cluster client holds at most 100 connections per node and refuses the next call at
once (``MaxConnectionsError``), where a one-server client's ``BlockingConnectionPool`` waits.
An application's cluster client (dtq/connection.py, ``wait_for_connection``) waits here
instead: at most ``n`` commands or pipelines in flight, each holding at most one connection per
node at a time. A call made from inside one already counted (a pipeline re-sending a redirected
command one by one through the client, in the same task or a task it started) is not counted
again: it would otherwise wait for its own pipeline's place.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator

# The gates the running task is inside (a task started inside one inherits it).
_INSIDE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "dtq_inflight_inside", default=frozenset()
)


class AsyncInFlight:
    """``async with gate():`` around each command and pipeline of one asyncio client."""

    def __init__(self, n: int) -> None:
        self._sem = asyncio.Semaphore(n)

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        inside = _INSIDE.get()
        if id(self) in inside:
            yield
            return
        async with self._sem:
            token = _INSIDE.set(inside | {id(self)})
            try:
                yield
            finally:
                _INSIDE.reset(token)


class SyncInFlight:
    """``with gate():`` around each command and pipeline of one blocking client's threads."""

    def __init__(self, n: int) -> None:
        self._sem = threading.BoundedSemaphore(n)
        self._local = threading.local()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if getattr(self._local, "inside", False):
            yield
            return
        with self._sem:
            self._local.inside = True
            try:
                yield
            finally:
                self._local.inside = False


_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()


def no_cap() -> contextlib.nullcontext[None]:
    """The gate of a client whose calls in flight are not capped (the worker's: its calls are
    bounded by the worker itself); works with ``with`` and ``async with``."""
    return _NULL
