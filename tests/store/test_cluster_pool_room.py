"""An application's cluster client keeps room on each node for its subscribed connection.

Its calls wait for one of 100 places (dtq/store/inflight.py), and each node's pool holds 100
connections; the ``result()`` waits' subscribed connection comes out of the same node's pool,
outside those places. So 100 calls in flight on the node that holds the subscription met a
full pool: the 100th raised RedisUnavailable ("Too many connections"), the flake of
test_many_result_waits_share_one_subscription[cluster] in CI. Here the calls are held in flight
together by stopping the nodes (SIGSTOP) on a private cluster without replicas, so no replica
takes over meanwhile. Real redis-servers, real threads, a real event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dtq import AsyncClient, Client
from dtq.store.keys import Keys
from tests.conftest import make_settings, wait_until
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

CALLS = 150  # more than the 100 places, so 100 are in flight on one node at once


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterFixture]:
    c = RedisClusterFixture(masters=3, replicas=0).start()
    yield c
    c.cleanup()


def _subscribed_node(cluster: RedisClusterFixture) -> RedisServer:
    """The node holding a connection subscribed to any channel (the client's one)."""
    found = []
    for node in cluster.live_nodes():
        with node.client() as r:
            if any(_subscribed(c) for c in r.client_list()):
                found.append(node)
    assert len(found) == 1, [n.port for n in found]
    return found[0]


def _queue_on(cluster: RedisClusterFixture, prefix: str, node: RedisServer) -> str:
    """A queue whose keys live on ``node``."""
    for i in range(200):
        q = f"q{i}"
        if cluster.master_of(Keys(prefix).queue(q).task("x")).port == node.port:
            return q
    raise AssertionError("no queue on that node")


def _all_paused(cluster: RedisClusterFixture, fire: Any) -> list[Any]:
    """Stop every node, run ``fire()`` (which starts the calls and returns what they gave) and
    let the nodes go on after a second, once the calls are all sent and waiting."""
    nodes = cluster.live_nodes()
    for n in nodes:
        n.pause()
    resume = threading.Timer(1.0, lambda: [n.resume() for n in nodes])
    resume.start()
    try:
        return list(fire())
    finally:
        resume.join()
        for n in nodes:
            n.resume()


def test_a_blocking_client_keeps_room_for_its_subscription(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    with Client(settings=make_settings(cluster.url, prefix)) as c:
        never = c.enqueue("add", [0, 0])  # no worker: its wait holds the subscription
        waiting = threading.Thread(target=_quiet_wait, args=(c, never.id), daemon=True)
        waiting.start()
        wait_until(lambda: _has_subscriber(cluster))
        h = c.enqueue("add", [1, 2], queue=_queue_on(cluster, prefix, _subscribed_node(cluster)))

        def fire() -> list[Any]:
            gate = threading.Barrier(CALLS)

            def one(_: int) -> Any:
                gate.wait()
                try:
                    return c.get(h.id)
                except Exception as exc:
                    return exc

            with ThreadPoolExecutor(CALLS) as pool:
                return list(pool.map(one, range(CALLS)))

        got = _all_paused(cluster, fire)
    errors = [g for g in got if isinstance(g, Exception)]
    assert not errors, f"{len(errors)} calls failed, e.g. {errors[0]!r}"


def test_an_asyncio_client_keeps_room_for_its_subscription(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(settings=make_settings(cluster.url, prefix)) as c:
            never = await c.enqueue("add", [0, 0])
            waiting = asyncio.create_task(c.result(never.id, timeout=30))
            for _ in range(400):  # (bounded: a subscription never seen fails, not hangs)
                if await asyncio.to_thread(_has_subscriber, cluster):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the result() wait never subscribed")
            node = await asyncio.to_thread(_subscribed_node, cluster)
            q = await asyncio.to_thread(_queue_on, cluster, prefix, node)
            h = await c.enqueue("add", [1, 2], queue=q)
            loop = asyncio.get_running_loop()

            async def fire() -> list[Any]:
                return await asyncio.gather(
                    *(c.get(h.id) for _ in range(CALLS)), return_exceptions=True
                )

            def paused() -> list[Any]:
                return asyncio.run_coroutine_threadsafe(fire(), loop).result(60)

            try:
                return await asyncio.to_thread(_all_paused, cluster, paused)
            finally:
                waiting.cancel()

    got = asyncio.run(main())
    errors = [g for g in got if isinstance(g, BaseException)]
    assert not errors, f"{len(errors)} calls failed, e.g. {errors[0]!r}"


def _subscribed(conn: dict[str, Any]) -> bool:
    """A connection subscribed to a channel: sharded (SSUBSCRIBE, a cluster's done waits) or
    not."""
    return int(conn.get("sub", 0)) > 0 or int(conn.get("ssub", 0)) > 0


def _has_subscriber(cluster: RedisClusterFixture) -> bool:
    for node in cluster.live_nodes():
        with node.client() as r:
            if any(_subscribed(c) for c in r.client_list()):
                return True
    return False


def _quiet_wait(c: Client, task_id: str) -> None:
    try:
        c.result(task_id, timeout=30)
    except Exception:  # (it ends with the test: the client closed or the wait timed out)
        return
