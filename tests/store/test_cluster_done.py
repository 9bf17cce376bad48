"""On a Redis Cluster the end of a task is announced with SPUBLISH on its queue's slot and the
``result()`` waits SSUBSCRIBE at that slot's node (lua/includes/done_pub.lua, dtq/sdk/donewait.py):
a PUBLISH there is relayed by the cluster bus to every node, a cost on each of them per task.
Here the waits read the record only at their deadline (no 5 s poll), so a wait that ends in time
was woken by the announcement; and the cluster bus carried no PUBLISH, to any node."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dtq import AsyncClient, Client
from dtq.sdk.client import ResultWait
from dtq.store.keys import Keys
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker, wait_until
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

N = 20


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result() wait reads the record again only at its deadline (not every 5 s)."""
    left = ResultWait.left

    def until_deadline(self: ResultWait, info: Any) -> float:
        left(self, info)  # (raises TimeoutError once the deadline has passed)
        assert self.deadline is not None
        return self.deadline - time.monotonic()

    monkeypatch.setattr(ResultWait, "left", until_deadline)


def _bus(node: RedisServer) -> dict[str, int]:
    """The cluster bus's pub/sub message counts of ``node`` (CLUSTER INFO)."""
    with node.client() as r:
        text = r.execute_command("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else str(text)
    fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return {
        k: int(fields.get(f"cluster_stats_messages_{k}", "0"))
        for k in ("publish_sent", "publish_received", "publishshard_sent",
                  "publishshard_received")
    }  # fmt: skip


class Bus:
    """The bus counters of every live node, before and after."""

    def __init__(self, cluster: RedisClusterFixture, prefix: str) -> None:
        self.owner = cluster.master_of(Keys(prefix).queue("default").done_channel("x"))
        self.cluster = cluster
        self.before = {n.port: _bus(n) for n in cluster.live_nodes()}

    def check(self) -> None:
        after = {n.port: _bus(n) for n in self.cluster.live_nodes()}
        delta = {p: {k: after[p][k] - self.before[p][k] for k in after[p]} for p in after}
        for port, d in delta.items():
            assert d["publish_sent"] == 0 and d["publish_received"] == 0, (port, delta)
            if port != self.owner.port:
                # Only the owner's replica hears of the SPUBLISHes (publishshard).
                assert d["publishshard_sent"] == 0, (port, delta)
        # (To its replica: counted as sent; the replica counts it when the bus delivers it.)
        assert delta[self.owner.port]["publishshard_sent"] >= N, delta


def _shard_subscribed(owner: RedisServer, channels: list[str]) -> bool:
    with owner.client() as r:
        counts = r.execute_command("PUBSUB", "SHARDNUMSUB", *channels)
    return all(int(n) == 1 for n in counts[1::2])


async def test_async_result_waits_are_woken_by_the_sharded_announcement(
    redis_cluster: RedisClusterFixture, prefix: str, no_poll: None
) -> None:
    s = make_settings(redis_cluster.url, prefix)
    qk = Keys(prefix).queue("default")
    bus = Bus(redis_cluster, prefix)
    async with AsyncClient(settings=s, app=app) as c:
        hs = [await c.enqueue("add", [i, 1]) for i in range(N)]
        waits = [asyncio.create_task(c.result(h, timeout=60)) for h in hs]
        channels = [qk.done_channel(h.id.split(":")[-1]) for h in hs]
        # Every wait is subscribed at its slot's node before any task runs.
        deadline = time.monotonic() + 10
        while not _shard_subscribed(bus.owner, channels):
            assert time.monotonic() < deadline, "the waits never subscribed"
            await asyncio.sleep(0.02)
        async with running_worker(app, s):
            assert await asyncio.gather(*waits) == [i + 1 for i in range(N)]
    bus.check()


def test_sync_result_waits_are_woken_by_the_sharded_announcement(
    redis_cluster: RedisClusterFixture, prefix: str, no_poll: None, spawn_worker: Any
) -> None:
    s = make_settings(redis_cluster.url, prefix)
    qk = Keys(prefix).queue("default")
    bus = Bus(redis_cluster, prefix)
    with Client(settings=s) as c, ThreadPoolExecutor(N) as pool:
        hs = [c.enqueue("add", [i, 1]) for i in range(N)]
        waits = [pool.submit(c.result, h, 60) for h in hs]
        channels = [qk.done_channel(h.id.split(":")[-1]) for h in hs]
        wait_until(lambda: _shard_subscribed(bus.owner, channels), timeout=10)
        spawn_worker("tests.apps.basic:app", s)
        assert [w.result(90) for w in waits] == [i + 1 for i in range(N)]
    bus.check()


def test_one_server_keeps_publish(redis_server: RedisServer, prefix: str) -> None:
    """On one server the announcement stays a PUBLISH (a SUBSCRIBE hears it)."""
    s = make_settings(redis_server.url, prefix)
    r = redis_server.client()
    with Client(settings=s) as c:
        h = c.enqueue("add", [1, 2])
        ps = r.pubsub()
        ps.subscribe(Keys(prefix).queue("default").done_channel(h.id.split(":")[-1]))
        assert c.cancel(h.id)
        got = [ps.get_message(timeout=5) for _ in range(2)]
        assert [m and m["type"] for m in got] == ["subscribe", "message"], got
        ps.close()
    r.close()
