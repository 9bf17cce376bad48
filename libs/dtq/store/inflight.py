"""A cap on a cluster client's calls in flight, commands and pipelines alike.

redis-py's cluster client refuses a call past 100 connections per node (``MaxConnectionsError``)
where a one-server ``BlockingConnectionPool`` waits; an application's cluster client
(``wait_for_connection``) waits here instead. A call made inside one already counted (a pipeline
re-sending a redirected command) is not counted again, or it would wait for its own place.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator

# The gates the running task is inside (a task started inside one inherits it).
_INSIDE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "dtq_inflight_inside", default=frozenset()
)


class AsyncInFlight:
    """``async with gate():`` around each command and pipeline of one asyncio client."""

    def __init__(self, n: int) -> None:
        self._sem = asyncio.Semaphore(n)

    def __call__(self) -> _AsyncPlace:
        return _AsyncPlace(self)


class _AsyncPlace:
    """One call's place in an :class:`AsyncInFlight` (a class: cheaper than a generator)."""

    __slots__ = ("_gate", "_token")

    def __init__(self, gate: AsyncInFlight) -> None:
        self._gate = gate
        self._token: contextvars.Token[frozenset[int]] | None = None

    async def __aenter__(self) -> None:
        inside = _INSIDE.get()
        if id(self._gate) not in inside:
            await self._gate._sem.acquire()
            self._token = _INSIDE.set(inside | {id(self._gate)})

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            _INSIDE.reset(self._token)
            self._gate._sem.release()


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
