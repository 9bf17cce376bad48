"""dtq on Redis Cluster: the URL form, and what differs from one server (each queue its own
slot): the idle wake-up over queues on different nodes, the event stream across queues, the
SCAN walks. Bodies marked ``cluster`` run against one redis-server and against the test cluster
(tests/redis_cluster.py); the foundation tests elsewhere carry the same marker."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskStatus
from dtq import scripts as sc
from dtq.admin import Admin
from dtq.errors import ConfigError, RedisUnavailable
from dtq.settings import checked_redis_url
from dtq.store.cluster import scan_step
from dtq.store.connection import async_redis, is_cluster, parse_cluster_url, sync_redis
from dtq.store.keys import Keys
from dtq_worker import consumer, retention
from dtq_worker import worker as worker_module
from tests.apps.basic import app
from tests.conftest import create_groups, make_settings, running_worker
from tests.helpers import spread_queues
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import free_port


def test_cluster_urls_are_parsed_and_checked() -> None:
    c = parse_cluster_url("redis+cluster://u:p%40ss@h1:7000,[::1]:7001/")
    assert c.nodes == [("h1", 7000), ("::1", 7001)] and not c.ssl
    assert (c.username, c.password) == ("u", "p@ss")
    tls = parse_cluster_url("rediss+cluster://h:1?ssl_ca_certs=/ca.pem")
    assert tls.ssl and tls.options == {"ssl_ca_certs": "/ca.pem"}
    assert checked_redis_url("redis+cluster://h:1,h:2") == "redis+cluster://h:1,h:2"
    for bad, says in [
        ("redis+cluster://h", "must be host:port"),
        ("redis+cluster://h:1/0", "one database"),
        ("redis+cluster://h:x", "must be host:port"),
        ("redis+cluster://h:1?db=2", "bad option: 'db'"),
    ]:
        with pytest.raises(ConfigError, match=says):
            checked_redis_url(bad)
    assert is_cluster(async_redis("redis+cluster://127.0.0.1:1"))  # connects on first use
    assert not is_cluster(sync_redis("redis://127.0.0.1:1"))


def test_an_unreachable_cluster_is_one_clear_error(prefix: str) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(RedisUnavailable, match="Redis unreachable"):
        Client(settings=make_settings(url, prefix))


async def test_an_unreachable_cluster_is_one_clear_error_for_asyncio(prefix: str) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    async with AsyncClient(settings=make_settings(url, prefix)) as c:
        with pytest.raises(RedisUnavailable, match="Redis unreachable"):
            await c.get("default:0123")


def test_the_cluster_fixture_refuses_a_command_across_queues(
    redis_cluster: RedisClusterFixture, prefix: str
) -> None:
    """What the per-queue reads below avoid: one XREAD over two queues' bands."""
    a, b = spread_queues(redis_cluster, prefix, 2)
    keys = Keys(prefix)
    with redis_cluster.client() as rc, pytest.raises(redis.RedisClusterException):
        rc.xread({keys.queue(a).streams[0]: "0", keys.queue(b).streams[0]: "0"}, block=10)


async def idle(w: Any) -> None:
    for _ in range(500):
        if w.env.idle:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker never went idle")


@pytest.mark.cluster
async def test_an_idle_worker_wakes_for_a_task_on_any_of_its_queues(
    backend: Any, prefix: str
) -> None:
    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix, queues=queues)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        for i in range(6):
            await idle(w)
            h = await c.enqueue("add", [i, 1], queue=queues[i % 3])
            assert await c.result(h.id, timeout=10) == i + 1
            assert (await c.get(h.id)).attempt == 1


@pytest.mark.cluster
async def test_a_stop_ends_the_idle_wait_at_once(
    backend: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer, "IDLE_BLOCK_MS", 10_000)
    monkeypatch.setattr(consumer, "IDLE_WAIT_TIMEOUT_S", 12.0)
    s = make_settings(backend.url, prefix, queues=spread_queues(backend, prefix, 2))
    async with running_worker(app, s) as w:
        await idle(w)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5.0  # not the 10 s block


def _losing_a_cancel(make: Any, readers: list[asyncio.Task[Any]]) -> Any:
    """worker_clients whose blocking client's reads drop the first cancel they get and go on
    waiting, as a real one does now and then (dtq/aiotasks.py: Python 3.11's wait_for round
    redis-py's send)."""

    def clients(*args: Any) -> Any:
        calls, blocking = make(*args)
        real = blocking.xread

        async def xread(streams: dict[str, str], **kw: Any) -> Any:
            task = asyncio.current_task()
            assert task is not None
            readers.append(task)
            with contextlib.suppress(asyncio.CancelledError):
                return await real(streams, **kw)
            await asyncio.Event().wait()  # the reply, which nobody reads any more

        blocking.xread = xread
        return calls, blocking

    return clients


async def test_a_stop_ends_every_idle_read_even_one_that_lost_its_cancel(
    redis_cluster: RedisClusterFixture, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idle wait's reads (one per queue) outlived the worker: a cancel lost at the stop
    # left one waiting on a client the worker had closed (seen in the API's event hub, which
    # reads the same way: tests/api/test_api_events_hub.py).
    readers: list[asyncio.Task[Any]] = []
    monkeypatch.setattr(
        worker_module, "worker_clients", _losing_a_cancel(worker_module.worker_clients, readers)
    )
    s = make_settings(redis_cluster.url, prefix, queues=spread_queues(redis_cluster, prefix, 2))
    async with running_worker(app, s) as w:
        await idle(w)
        async with asyncio.timeout(10):
            while len(readers) < 2:  # one read per queue
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # blocked in Redis
    assert [t for t in readers if not t.done()] == []


@pytest.mark.cluster
async def test_the_event_stream_follows_queues_on_different_nodes(
    backend: Any, prefix: str
) -> None:
    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix)
    async with Admin(s) as a:
        for q in queues:
            await a.client.enqueue("add", [0, 0], queue=q)  # registers each queue
        _, cursors = await a.read_events(None, block_ms=0)

        async def later() -> str:
            await asyncio.sleep(0.3)  # while read_events below blocks
            return (await a.client.enqueue("add", [1, 1], queue=queues[2])).id

        t0 = time.monotonic()
        sent = asyncio.ensure_future(later())
        evs, cursors = await a.read_events(cursors, block_ms=5000)
        assert time.monotonic() - t0 < 4.0  # woken by the entry, not the 5 s block
        assert [(e.type, e.task_id) for e in evs] == [("enqueued", await sent)]
        # Nothing is read twice, nothing is skipped on the next call.
        h0 = await a.client.enqueue("add", [2, 2], queue=queues[0])
        evs, _ = await a.read_events(cursors, block_ms=1000)
        assert [(e.type, e.task_id) for e in evs] == [("enqueued", h0.id)]


@pytest.mark.cluster
async def test_a_scan_walk_finds_keys_on_every_node(backend: Any, prefix: str) -> None:
    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix)
    async with AsyncClient(settings=s) as c:
        ids = {(await c.enqueue("add", [i, 0], queue=q)).id for i, q in enumerate(queues)}
        r = async_redis(s.redis_url, decode_responses=True)
        try:
            cursor, found = "0", set()
            while True:
                cursor, batch = await scan_step(r, cursor, f"{prefix}:{{{prefix}:*}}:t:*", 10)
                found.update(batch)
                if cursor == "0":
                    break
        finally:
            await r.aclose()
        keys = Keys(prefix)
        expect = set()
        for i in ids:
            q, tid = i.split(":")
            expect.add(keys.queue(q).task(tid))
        assert found == expect


@pytest.mark.cluster
async def test_retention_scans_every_node(
    backend: Any, prefix: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention's key scan (a walk over every primary on a cluster) finds waiting work in
    queues on every node: each missing from the registry is registered again."""
    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix, retention_interval_s=3600)
    keys = Keys(prefix)
    async with AsyncClient(settings=s) as c:
        for q in queues:
            for i in range(30):  # more keys than one SCAN call returns (SCAN_COUNT patched)
                await c.enqueue("add", [i, 0], queue=q)
    r.delete(keys.queues)
    monkeypatch.setattr(retention, "SCAN_COUNT", 20)  # a walk of many calls and passes
    monkeypatch.setattr(retention, "SCAN_CALLS", 2)
    async with running_worker(app, s) as w:
        ret = w.scheduler.retention
        ret.cursor = "0"
        for _ in range(5000):  # (the session's server holds other tests' keys too)
            rep = await ret.run_once()
            if rep.scan_done:
                break
        assert rep.scan_done
        assert set(queues) <= set(r.smembers(keys.queues))


@pytest.mark.cluster
async def test_the_task_listing_pages_across_nodes(backend: Any, prefix: str) -> None:
    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix)
    async with Admin(s) as a:
        ids = {(await a.client.enqueue("add", [i, 0], queue=q)).id for i, q in enumerate(queues)}
        seen: list[str] = []
        cursor = None
        for _ in range(20):
            page = await a.list_tasks(cursor=cursor, limit=1)
            seen += [t["id"] for t in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids)
        assert [(await a.client.get(i)).status for i in ids] == [TaskStatus.QUEUED] * 3


def test_settings_accept_the_cluster_url(redis_cluster: RedisClusterFixture) -> None:
    assert Settings(redis_url=redis_cluster.url).redis_url == redis_cluster.url


def test_a_script_never_runs_half_way_while_its_slot_migrates(
    redis_cluster: RedisClusterFixture, prefix: str
) -> None:
    """The claim delivers entries (a write) and then reads their task records, keys it is not
    given. Mid-migration, with the record already on the new node, Redis would fail the script
    at that read with the delivery kept (a run nobody started). With the slot guard the claim
    does not run until the migration ends, then runs whole on the new owner."""
    s = make_settings(redis_cluster.url, prefix)
    qk = Keys(prefix).queue("default")
    with Client(settings=s) as c:
        create_groups(c.redis, qk)
        h = c.enqueue("add", [1, 1])
        tid = h.id.split(":")[1]
        move = redis_cluster.begin_move(qk.task(tid))
        move.migrate(qk.task(tid))  # the record first: the streams are still on the source
        scripts = sc.SyncScripts(c.redis)
        got: list[Any] = []
        t = threading.Thread(
            target=lambda: got.append(scripts.run(sc.claim_call(qk, "w1", 1, 1000, 60)))
        )
        t.start()
        t.join(1.0)
        assert t.is_alive() and not got, "the claim ran on a slot in migration"
        move.finish()
        t.join(30)
        batch = sc.parse_claim("default", got[0])
        assert [r.tid for r in batch.runs] == [tid]
        info = c.get(h.id)
        assert (info.status, info.attempt, info.worker_id) == (TaskStatus.RUNNING, 1, "w1")


def test_the_slot_guard_keeps_a_script_from_running_half_way(
    redis_cluster: RedisClusterFixture, prefix: str
) -> None:
    """The hazard and its guard, on a script whose given keys all exist (dtq's scripts also
    name key prefixes, keys that never exist, which guard them the same way)."""
    r = sync_redis(redis_cluster.url, decode_responses=True)
    a, b = f"{prefix}:{{{prefix}:g}}:a", f"{prefix}:{{{prefix}:g}}:b"
    r.set(a, "0")
    r.set(b, "1")
    # Writes the key it is given, then reads one of the same slot that it builds itself.
    script = "redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[1]:sub(1, -2) .. 'b')"
    move = redis_cluster.begin_move(a)
    move.migrate(b)  # b is on the new node already, a still on the old one
    with pytest.raises(redis.ResponseError, match="non local key"):
        r.eval(script, 1, a)  # type: ignore[no-untyped-call]
    assert move.s.get(a) == "1", "unguarded, the script stopped half-way, its write kept"
    got: list[Any] = []
    keys = sc.with_slot_guard([a])
    t = threading.Thread(target=lambda: got.append(r.eval(script, len(keys), *keys)))  # type: ignore[no-untyped-call]
    t.start()
    t.join(1.0)
    assert t.is_alive() and move.s.get(a) == "1", "a guarded script ran during the migration"
    move.finish()
    t.join(30)
    assert got == ["1"] and r.get(a) == "2"  # run once, whole, on the new owner
    r.close()


def test_dtq_testing_runs_unchanged_with_a_cluster_url_set(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    """dtq.testing keeps its queue in fakeredis (which has no cluster): a suite using it runs
    the same when the environment names a cluster (nothing is sent to it)."""
    from dtq.testing import TestQueue

    monkeypatch.setenv("DTQ_REDIS_URL", f"redis+cluster://127.0.0.1:{free_port()}")
    with TestQueue(app) as tq:
        tq.client.enqueue("add", [2, 3])
        [info] = tq.drain()
        assert info.status == TaskStatus.SUCCEEDED and tq.client.result(info.id) == 5


def test_cluster_errors_are_transient_for_the_worker() -> None:
    from redis import exceptions as rex

    from dtq_worker.faults import is_transient

    transient = [
        rex.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        rex.AskError("1234 127.0.0.1:7001"),
        rex.MovedError("1234 127.0.0.1:7001"),
        rex.ClusterDownError("CLUSTERDOWN The cluster is down"),
        rex.SlotNotCoveredError("slot 1234 not covered"),
        rex.ClusterError("TTL exhausted."),
        rex.ResponseError("Script attempted to access a non local key in a cluster node"),
        rex.ConnectionError("Redis Cluster cannot be connected"),
    ]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    permanent = [
        rex.ResponseError("ERR unknown command"),
        rex.ResponseError("CROSSSLOT Keys in request don't hash to the same slot"),
        rex.RedisClusterException("ERROR: Calling pipelined function time is blocked"),
        ValueError("bug"),
    ]
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)


async def test_a_fresh_asyncio_cluster_client_can_subscribe_first(
    redis_cluster: RedisClusterFixture,
) -> None:
    """The worker's cancel listener and AsyncClient.result subscribe before anything else."""
    r = async_redis(redis_cluster.url, decode_responses=True)
    ps = r.pubsub()
    try:
        await ps.subscribe("dtq-test-channel")
        msg = await ps.get_message(timeout=5.0)
        assert msg is not None and msg["type"] == "subscribe"
    finally:
        await ps.aclose()  # type: ignore[no-untyped-call]
        await r.aclose()
