"""The flow mover under a Redis outage: its readers run in a TaskGroup, whose ExceptionGroup
hid a transient error from the loop supervisor, which then logged every outage as a crash
(ERROR with a traceback) instead of one warning per outage."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import redis.exceptions as rex

from dtq.store.keys import Keys
from dtq_worker.faults import is_transient
from dtq_worker.flowmover import FlowMover
from dtq_worker.supervisor import supervise


class _Down:
    """A Redis client whose every call fails as a server that closed the connection."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*_: Any, **__: Any) -> Any:
            raise rex.ConnectionError("Connection closed by server.")

        return fail


class _Worker:
    """What the mover reads of a worker: keys, queues, its two clients, settings, stopping."""

    def __init__(self, stopping: list[bool]) -> None:
        self.keys, self.queues, self.worker_id = Keys("t"), ["default", "other"], "w1"
        self.redis, self.blocking = _Down(), _Down()
        self.settings = SimpleNamespace(visibility_timeout_s=3.0)
        self._stopping = stopping

    @property
    def stopping(self) -> bool:
        return self._stopping[0]


def _worker(stopping: list[bool]) -> Any:
    return _Worker(stopping)


async def test_a_mover_reader_losing_redis_raises_the_transient_error_itself() -> None:
    m = FlowMover(_worker([False]))
    m._grouped.update(m._outboxes())  # the groups exist: the readers are what fails
    with pytest.raises(Exception) as exc:
        await m.loop()
    assert is_transient(exc.value), repr(exc.value)


async def test_the_supervisor_logs_a_mover_outage_as_transient_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopping = [False]
    m = FlowMover(_worker(stopping))
    m._grouped.update(m._outboxes())
    calls = 0

    async def body() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            stopping[0] = True
        await m.loop()

    with caplog.at_level(logging.WARNING, logger="dtq"):
        await supervise("flows", body, lambda: stopping[0])
    assert calls == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "transient Redis error" in caplog.text
