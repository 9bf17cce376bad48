"""Every Redis error reply is raised, on every path a script call takes, and maps to its dtq error.

redis-py raises some error replies as ``ConnectionError`` subclasses (``LOADING``: Redis loading
its data after a restart; ``NOAUTH`` / ``WRONGPASS``; ``max number of clients``), the rest as
``ResponseError`` subclasses (``READONLY``, ``OOM``). A reply of either kind is an answer, never
a result: a caller that took one for its script's reply would count a chord enqueue that Redis
refused as done (the chaos soak lost chords that way across Redis restarts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
import redis.exceptions as rex

from dtq import AsyncClient, Client, RedisUnavailable
from dtq import scripts as sc
from dtq.store import transport
from dtq.store.keys import Keys
from tests.conftest import make_settings, wait_until
from tests.error_server import ErrorRelay
from tests.redis_server import RedisServer

# (the error line, the redis-py error it is, what dtq's Client says of it)
REPLIES = {
    "LOADING": ("LOADING Redis is loading the dataset in memory", rex.BusyLoadingError,
                "Redis unreachable: Redis is loading"),
    "NOAUTH": ("NOAUTH Authentication required.", rex.AuthenticationError,
               "Redis refused the credentials"),
    "WRONGPASS": ("WRONGPASS invalid username-password pair or user is disabled.",
                  rex.AuthenticationError, "Redis refused the credentials"),
    "READONLY": ("READONLY You can't write against a read only replica.", rex.ReadOnlyError,
                 "Redis refused the write: You can't write"),
    "OOM": ("OOM command not allowed when used memory > 'maxmemory'.", rex.OutOfMemoryError,
            "Redis is out of memory"),
    "MAXCLIENTS": ("ERR max number of clients reached", rex.MaxClientsReachedError,
                   "Redis unreachable: max number of clients"),
}  # fmt: skip
ECHO = "return ARGV[1]"


@pytest.fixture(params=sorted(REPLIES))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[True, False], ids=["lane", "usual"])
def fast(request: pytest.FixtureRequest) -> bool:
    if request.param and not transport.fast_lane(None):
        pytest.skip("the fast lane is off here")
    return bool(request.param)


@pytest.fixture
def relay(redis_server: RedisServer) -> Iterator[ErrorRelay]:
    rel = ErrorRelay(redis_server.port)
    yield rel
    rel.close()


def _echo(s: sc.SyncScripts | sc.AsyncScripts, r: object, v: str) -> sc.Call:
    s._objs["echo"] = r.register_script(ECHO)  # type: ignore[attr-defined]
    return sc.Call("echo", [], [v])


def test_sync_script_calls_raise_every_error_reply(
    relay: ErrorRelay, kind: str, fast: bool
) -> None:
    line, error, _ = REPLIES[kind]
    r = redis.Redis.from_url(relay.url, decode_responses=True)
    s = sc.SyncScripts(r, fast_lane=fast)
    call = _echo(s, r, "a")
    assert s.run(call) == "a"  # (through the relay to Redis: the lane is connected)
    relay.refuse(line)
    for _ in range(2):
        with pytest.raises(error):
            s.run(call)
    with pytest.raises(error):
        s.run_many([call, call])
    with r.pipeline(transaction=False) as pipe:
        s.run(call, pipe)
        with pytest.raises(error):
            pipe.execute()
    assert b"EVALSHA" in relay.refused
    r.close()


async def test_async_script_calls_raise_every_error_reply(
    relay: ErrorRelay, kind: str, fast: bool
) -> None:
    line, error, _ = REPLIES[kind]
    r = aredis.Redis.from_url(relay.url, decode_responses=True)
    s = sc.AsyncScripts(r, fast_lane=fast)
    call = _echo(s, r, "a")
    assert await s.run(call) == "a"
    relay.refuse(line)
    for _ in range(2):
        with pytest.raises(error):
            await s.run(call)
    with pytest.raises(error):
        await s.run_many([call, call])
    async with r.pipeline(transaction=False) as pipe:
        await s.run(call, pipe)
        with pytest.raises(error):
            await pipe.execute()
    assert b"EVALSHA" in relay.refused
    await r.aclose()


async def test_the_worker_claim_pair_never_answers_with_an_error_reply(
    relay: ErrorRelay, kind: str, fast: bool
) -> None:
    """The idle wait's pair (XREAD, then the claim): an error reply of the ConnectionError kind
    is raised (the lane dropped), one of the ResponseError kind returned as itself, which the
    consumer raises (consumer.py); neither is a claim's reply."""
    line, error, _ = REPLIES[kind]
    r = aredis.Redis.from_url(relay.url, decode_responses=True)
    lane = transport.AsyncLane(r, fast=fast)
    assert await lane.call(("PING",)) in ("PONG", True)
    relay.refuse(line)
    if issubclass(error, rex.ResponseError):
        one, two = await lane.call_pair(("PING",), ("EVALSHA", "0" * 40, 0), 5)
        assert isinstance(one, error) and isinstance(two, error)
        assert lane.connected  # in step: kept
    else:
        with pytest.raises(error):
            await lane.call_pair(("PING",), ("EVALSHA", "0" * 40, 0), 5)
        assert not lane.connected
    await lane.drop()
    await r.aclose()


def test_client_enqueue_raises_the_dtq_error_of_every_error_reply(
    relay: ErrorRelay, prefix: str, kind: str
) -> None:
    line, _, says = REPLIES[kind]
    with Client(settings=make_settings(relay.url, prefix, client_retries=1)) as c:
        c.enqueue("noop")  # the queue registered: the next enqueues are one script call
        relay.refuse(line)
        for _ in range(2):
            with pytest.raises(RedisUnavailable, match=says):
                c.enqueue("noop")
        with pytest.raises(RedisUnavailable, match=says):
            c.enqueue_many([{"name": "noop"}] * 300)  # streamed in parts
    assert b"EVALSHA" in relay.refused


async def test_async_client_enqueue_raises_the_dtq_error_of_every_error_reply(
    relay: ErrorRelay, prefix: str, kind: str
) -> None:
    line, _, says = REPLIES[kind]
    async with AsyncClient(settings=make_settings(relay.url, prefix, client_retries=1)) as c:
        await c.enqueue("noop")
        relay.refuse(line)
        for _ in range(2):
            with pytest.raises(RedisUnavailable, match=says):
                await c.enqueue("noop")
        with pytest.raises(RedisUnavailable, match=says):
            await c.enqueue_many([{"name": "noop"}] * 300)
    assert b"EVALSHA" in relay.refused


# --- a real Redis loading its data after a restart --------------------------------------------


def test_a_loading_redis_fails_the_enqueue_and_then_takes_it(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """The soak's case on a real server: a client that enqueued before a restart enqueues
    while Redis loads (no retries left: RedisUnavailable, nothing written), then after."""
    with Client(settings=make_settings(fresh_redis.url, prefix, client_retries=0)) as c:
        c.enqueue("noop")
        fresh_redis.restart_loading()
        for _ in range(2):  # (the first meets the old connection gone, the second LOADING)
            with pytest.raises(RedisUnavailable):
                c.enqueue("noop")
        with pytest.raises(RedisUnavailable, match="Redis is loading"):
            c.enqueue("noop")
        fresh_redis.finish_loading()
        h = c.enqueue("noop")
        assert c.get(h.id).status == "queued"
    r = fresh_redis.client()
    entries = sum(r.xlen(s) for s in Keys(prefix).queue("default").streams)
    assert entries == 2  # the first and the last only
    r.close()


def _loading_refusals(server: RedisServer) -> int:
    """How many commands the server has answered LOADING since it started."""
    r = server.client()
    try:
        return int(r.info("errorstats").get("errorstat_LOADING", {}).get("count", 0))
    finally:
        r.close()


def test_the_worker_rides_out_a_loading_redis(
    fresh_redis: RedisServer, prefix: str, spawn_worker: object, tmp_path: Path
) -> None:
    """A task that ends while Redis loads: its outcome write meets LOADING and is retried
    (the task is not run again); once loaded, the task ends succeeded on its first attempt."""
    settings = make_settings(
        fresh_redis.url, prefix, heartbeat_interval_s=5.0, visibility_timeout_s=60
    )
    release = tmp_path / "release"
    w = spawn_worker("tests.apps.faulty:app", settings)  # type: ignore[operator]
    with Client(settings=settings) as c:
        h = c.enqueue("until_file", kwargs={"path": str(release)})
        wait_until(lambda: c.get(h.id).status == "running", 20)
        fresh_redis.restart_loading()
        release.touch()
        wait_until(lambda: "outcome write: Redis error" in w.output(), 20)
        # (the first failure logged may be the restart's reset; the retries meet LOADING)
        seen = _loading_refusals(fresh_redis)
        wait_until(lambda: _loading_refusals(fresh_redis) >= seen + 3, 20)
        fresh_redis.finish_loading()
        assert c.result(h, timeout=30) == 1
        assert c.get(h.id).attempt == 1


def test_the_loading_server_helper_holds_and_ends_the_load(fresh_redis: RedisServer) -> None:
    fresh_redis.restart_loading()
    r = fresh_redis.client()
    with pytest.raises(rex.BusyLoadingError):
        r.set("k", "v")
    fresh_redis.finish_loading()
    assert r.set("k", "v")
    r.close()


async def test_async_loading_redis_fails_the_enqueue(fresh_redis: RedisServer, prefix: str) -> None:
    async with AsyncClient(settings=make_settings(fresh_redis.url, prefix, client_retries=0)) as c:
        await c.enqueue("noop")
        fresh_redis.restart_loading()
        for _ in range(2):
            with pytest.raises(RedisUnavailable):
                await c.enqueue("noop")
        with pytest.raises(RedisUnavailable, match="Redis is loading"):
            await c.enqueue("noop")
        fresh_redis.finish_loading()
        await asyncio.wait_for(c.enqueue("noop"), 10)
