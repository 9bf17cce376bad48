"""The fast lane on a Redis Cluster (dtq.store.cluster): script calls go over a kept connection to
the node serving their hash tag; a call the node does not run (a redirect while or after its
slot moves, TRYAGAIN) takes the cluster client's path, and the next call finds the new owner.

A private cluster without replicas (its slots are moved here). Real redis-servers. Tests that
look at the lanes are skipped where the lane is off (DTQ_FAST_LANE=0, or a redis-py without
what it needs: dtq.store.transport.missing); the rest hold either way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, TaskStatus
from dtq import scripts as sc
from dtq.store import transport
from dtq.store.connection import async_redis
from dtq.store.keys import Keys
from dtq.store.record import DEFAULT_PRIORITY
from tests.conftest import create_groups, make_settings
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

pytestmark = pytest.mark.filterwarnings("ignore::dtq.errors.UndeclaredTaskWarning")
needs_lane = pytest.mark.skipif(
    not transport.fast_lane(), reason="the fast lane is off here (DTQ_FAST_LANE=0 or redis-py)"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterFixture]:
    c = RedisClusterFixture(masters=3, replicas=0).start()
    yield c
    c.cleanup()


def evalshas(node: RedisServer) -> int:
    """EVALSHA calls the node has run so far."""
    return _evalsha_stat(node, "calls")


def refused(node: RedisServer) -> int:
    """EVALSHA calls the node has refused so far (a redirect, TRYAGAIN)."""
    return _evalsha_stat(node, "rejected_calls")


def _evalsha_stat(node: RedisServer, field: str) -> int:
    with node.client() as c:
        return int(c.info("commandstats").get("cmdstat_evalsha", {}).get(field, 0))


def stream_of(prefix: str) -> str:
    """The band a default enqueue lands in (every band shares the queue's slot)."""
    return Keys(prefix).queue("default").stream(DEFAULT_PRIORITY)


@needs_lane
def test_single_enqueues_take_the_lane_of_their_node(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    node = cluster.master_of(stream_of(prefix))
    with Client(settings=make_settings(cluster.url, prefix)) as c:
        c.enqueue("noop")  # loads the script on the nodes (a NOSCRIPT takes the usual path)
        routes = c._scripts.routes
        assert routes is not None
        before, served = routes.calls, evalshas(node)
        handles = [c.enqueue("noop") for _ in range(20)]
        assert routes.calls - before == 20
        assert evalshas(node) - served == 20
        assert {c.get(h.id).status for h in handles} == {TaskStatus.QUEUED}


def test_without_the_fast_lane_a_cluster_client_has_no_routes(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    with Client(settings=make_settings(cluster.url, prefix, fast_lane=False)) as c:
        c.enqueue("noop")
        assert c._scripts.routes is None


@needs_lane
def test_an_error_reply_on_the_lane_raises_and_the_lane_stays_in_step(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    with Client(settings=make_settings(cluster.url, prefix)) as c:
        c.enqueue("noop")
        routes = c._scripts.routes
        assert routes is not None
        stream = stream_of(prefix)
        c.redis.rename(stream, stream + ":saved")
        c.redis.set(stream, "not a stream")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            c.enqueue("noop")
        c.redis.delete(stream)
        c.redis.rename(stream + ":saved", stream)
        before = routes.calls
        h = c.enqueue("noop")
        assert routes.calls == before + 1 and c.get(h.id).status == TaskStatus.QUEUED


@needs_lane
def test_a_moved_slot_falls_back_once_then_takes_the_new_owners_lane(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    """After the move the cached node answers MOVED: that call takes the cluster client's path
    (which learns the new owner), the next goes over the new owner's lane."""
    stream = stream_of(prefix)
    with Client(settings=make_settings(cluster.url, prefix)) as c:
        first = c.enqueue("noop")
        routes = c._scripts.routes
        assert routes is not None
        move = cluster.begin_move(stream)
        move.finish()
        src, dst = move.src, move.dst
        before, src_served, src_refused = routes.calls, evalshas(src), refused(src)
        moved = c.enqueue("noop")
        assert routes.calls == before, "a call the old owner refused counted as run there"
        # The lane's try, answered MOVED (and the cluster client's own, its map stale too).
        src_refused_now = refused(src)
        assert src_refused_now > src_refused
        dst_served = evalshas(dst)
        last = c.enqueue("noop")
        assert routes.calls == before + 1, "the call after the move did not take a lane"
        assert (evalshas(src), evalshas(dst)) == (src_served, dst_served + 1)
        assert refused(src) == src_refused_now
        for h in (first, moved, last):
            assert c.get(h.id).status == TaskStatus.QUEUED
        with dst.client() as d:
            assert d.xlen(stream) == 3
        with src.client() as s:
            assert s.execute_command("CLUSTER", "COUNTKEYSINSLOT", move.slot) == 0


@needs_lane
def test_a_call_during_a_migration_waits_for_it_then_runs_on_the_new_owner(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    """Mid-migration the lane's node answers ASK (the slot guard: a key is missing), and the
    new owner TRYAGAIN: the call waits in the cluster client's path until the move ends, runs
    once there, and later calls take the new owner's lane."""
    stream = stream_of(prefix)
    with Client(settings=make_settings(cluster.url, prefix)) as c:
        first = c.enqueue("noop")
        routes = c._scripts.routes
        assert routes is not None
        move = cluster.begin_move(stream)
        move.migrate(*move.s.execute_command("CLUSTER", "GETKEYSINSLOT", move.slot, 1))
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(c.enqueue("noop")))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not got, "the enqueue ran on a slot in migration"
        move.finish()
        t.join(30)
        assert got, "the enqueue did not end after the migration"
        # The waiting call may have been served through an ASK redirect, which leaves the slot
        # map as it was: the next call then meets MOVED on the old owner and takes the usual
        # path, which follows it and updates the map (or the map is right and it takes the lane).
        between = c.enqueue("noop")
        before, served = routes.calls, evalshas(move.dst)
        last = c.enqueue("noop")
        assert routes.calls == before + 1 and evalshas(move.dst) == served + 1
        for h in (first, got[0], between, last):
            assert c.get(h.id).status == TaskStatus.QUEUED
        with move.dst.client() as d:
            assert d.xlen(stream) == 4


@needs_lane
async def test_asyncio_calls_take_the_lane_and_follow_a_moved_slot(
    cluster: RedisClusterFixture, prefix: str
) -> None:
    """The asyncio runner (the worker's, the AsyncClient's): the same, claims included."""
    stream = stream_of(prefix)
    qk = Keys(prefix).queue("default")
    async with AsyncClient(settings=make_settings(cluster.url, prefix)) as c:
        await c.enqueue("noop")
        routes = c._scripts.routes
        assert routes is not None
        before = routes.calls
        for _ in range(5):
            await c.enqueue("noop")
        assert routes.calls - before == 5
        move = cluster.begin_move(stream)
        move.finish()
        await c.enqueue("noop")  # MOVED on the cached node: the cluster client's path
        before, served = routes.calls, evalshas(move.dst)
        await c.enqueue("noop")
        assert routes.calls == before + 1 and evalshas(move.dst) == served + 1
    worker = async_redis(cluster.url, decode_responses=True)
    try:
        with Client(settings=make_settings(cluster.url, prefix)) as sc_client:
            create_groups(sc_client.redis, qk)
        scripts = sc.AsyncScripts(worker)
        assert scripts.routes is not None
        batch = sc.parse_claim("default", await scripts.run(sc.claim_call(qk, "w1", 50, 1000, 60)))
        batch2 = sc.parse_claim("default", await scripts.run(sc.claim_call(qk, "w1", 50, 1000, 60)))
        assert len(batch.runs) + len(batch2.runs) == 8
        assert scripts.routes.calls >= 1
    finally:
        await worker.aclose()
