"""The API's event hub: a stream that has said it is connected misses no later event."""

from __future__ import annotations

import asyncio

import pytest

from dtq import Client
from dtq.admin import Admin
from dtq.settings import Settings
from dtq_api.events import EventHub, sse

pytestmark = pytest.mark.cluster


async def test_an_event_right_after_connected_is_streamed(settings: Settings) -> None:
    with Client(settings=settings) as c:
        c.enqueue("noop")  # the queue is known before the stream starts
        hub = EventHub(lambda: Admin(settings), 4)
        try:
            frames = sse(hub.subscribe(), ping_s=30)
            assert await frames.__anext__() == b": connected\n\n"
            # No await between the greeting and this enqueue: the hub's reader has had no turn,
            # so the event is in Redis before the reader has looked at the streams at all.
            tid = c.enqueue("noop").id
            got = await asyncio.wait_for(frames.__anext__(), 10)
            assert tid.encode() in got, got
        finally:
            await hub.close()
