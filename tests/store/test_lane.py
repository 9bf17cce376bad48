"""The scripts' fast lane (store/transport.py): one kept connection, and every way it falls back.

Tests that look at the lane itself are skipped where it is off (DTQ_FAST_LANE=0, or a redis-py
without what it needs: ``make test-lanes-off``, ``make test-oldest``); the rest run either way."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from dtq import AsyncClient, Client, InvalidRequest, RedisUnavailable
from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store import transport
from tests.conftest import make_settings
from tests.helpers import needs_lane
from tests.redis_server import RedisServer

# Busy for about 0.3 s inside Redis, then answers its ARGV[1]: a call that can be cut mid-reply.
SPIN = """
local t0 = redis.call('TIME')
local start = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
while true do
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > 300000 then break end
end
return ARGV[1]
"""
ECHO = "return ARGV[1]"


def _with(scripts: Any, client: Any) -> Any:
    scripts._objs["spin"] = client.register_script(SPIN)
    scripts._objs["echo"] = client.register_script(ECHO)
    return scripts


@needs_lane
def test_sync_lane_survives_script_flush_and_restart(fresh_redis: RedisServer) -> None:
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    s = _with(sc.SyncScripts(r), r)
    drops = []
    real_drop = s.lane.drop
    s.lane.drop = lambda: (drops.append(1), real_drop())
    assert s.run(sc.Call("echo", [], ["a"])) == "a"
    assert s.lane.connected  # the call went through the lane
    r.script_flush()  # NOSCRIPT on the lane: redis-py loads the script, nothing ran twice
    assert s.run(sc.Call("echo", [], ["b"])) == "b"
    fresh_redis.restart()  # the lane's socket is dead: dropped, the usual path reconnects
    assert s.run(sc.Call("echo", [], ["c"])) == "c"
    assert s.run(sc.Call("echo", [], ["d"])) == "d"
    assert drops == [1] and s.lane.connected  # dropped once, then a working lane again
    r.close()


def test_sync_lane_is_thread_safe(redis_server: RedisServer, prefix: str) -> None:
    """Eight threads share one Client: every enqueue gets its own answer, none is lost."""
    settings = make_settings(redis_server.url, prefix)
    ids: list[str] = []
    lock = threading.Lock()
    with Client(settings=settings) as c:

        def work() -> None:
            mine = [c.enqueue("noop").id for _ in range(150)]
            with lock:
                ids.extend(mine)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(ids)) == 1200
        # Each handle names a task that exists with that id: no reply went to the wrong caller.
        assert all(c.get(i).id == i for i in ids[::37])
        qk = c.keys.queue("default")
        assert sum(c.redis.xlen(st) for st in qk.streams) == 1200


def test_sync_lane_sends_a_call_bigger_than_one_write(redis_server: RedisServer) -> None:
    """The lane writes a call with one ``write`` (no poll first); what the socket buffer did not
    take goes after it, so a big call arrives whole and the connection stays in step."""
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    s = _with(sc.SyncScripts(r), r)
    big = "x" * (16 << 20)  # more than a loopback socket buffers at once
    assert s.run(sc.Call("echo", [], [big])) == big
    assert s.run(sc.Call("echo", [], ["after"])) == "after"
    r.close()


def test_sync_lane_read_timeout_drops_the_connection(redis_server: RedisServer) -> None:
    """The lane reads replies itself: a reply later than the socket timeout raises redis-py's
    TimeoutError and drops the connection, so the late reply can never answer the next call."""
    r = redis.Redis.from_url(redis_server.url, decode_responses=True, socket_timeout=0.1)
    s = _with(sc.SyncScripts(r), r)
    assert s.run(sc.Call("echo", [], ["warm"])) == "warm"
    with pytest.raises(redis.TimeoutError):
        s.run(sc.Call("spin", [], ["late"]))  # busy 0.3 s in Redis
    time.sleep(0.4)  # the late reply has come, to the dropped connection
    assert s.run(sc.Call("echo", [], ["next"])) == "next"
    r.close()


def test_sync_lane_in_a_forked_child(redis_server: RedisServer) -> None:
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    s = _with(sc.SyncScripts(r), r)
    assert s.run(sc.Call("echo", [], ["parent"])) == "parent"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        ok = s.run(sc.Call("echo", [], ["child"])) == "child"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert s.run(sc.Call("echo", [], ["parent again"])) == "parent again"
    r.close()


@needs_lane
async def test_async_lane_cancelled_mid_reply_never_mixes_replies(
    redis_server: RedisServer,
) -> None:
    r = aredis.Redis.from_url(redis_server.url, decode_responses=True)
    s = _with(sc.AsyncScripts(r), r)
    assert await s.run(sc.Call("echo", [], ["warm"])) == "warm"
    await r.script_load(SPIN)  # so the spin call is not a NOSCRIPT that goes the usual way
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s.run(sc.Call("spin", [], ["late"])), 0.05)
    assert [lane.connected for lane in s.lanes] == [False]  # the half-read connection was dropped
    # The late reply of the cancelled call must not be read as this call's answer.
    assert await s.run(sc.Call("echo", [], ["next"])) == "next"
    assert await s.run(sc.Call("echo", [], ["after"])) == "after"
    await r.aclose()


@needs_lane
async def test_async_lanes_busy_fall_back_and_restart(fresh_redis: RedisServer) -> None:
    r = aredis.Redis.from_url(fresh_redis.url, decode_responses=True)
    s = _with(sc.AsyncScripts(r), r)
    await r.script_load(SPIN)
    # More calls at once than lanes: each lane takes one, the rest go the usual way; every
    # call gets its own answer.
    n = transport.MAX_ASYNC_LANES + 2
    calls = [s.run(sc.Call("spin", [], [f"slow{i}"])) for i in range(n)]
    got = await asyncio.gather(*calls, s.run(sc.Call("echo", [], ["fast"])))
    assert got == [f"slow{i}" for i in range(n)] + ["fast"]
    assert len(s.lanes) == transport.MAX_ASYNC_LANES
    assert all(lane.connected and not lane.busy for lane in s.lanes)
    fresh_redis.restart()
    assert await s.run(sc.Call("echo", [], ["back"])) == "back"
    await r.aclose()


@needs_lane
async def test_async_client_enqueue_through_the_lane(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        hs = [await c.enqueue("noop") for _ in range(50)]
        assert [lane.connected for lane in c._scripts.lanes] == [True]
        assert len({h.id for h in hs}) == 50
        assert [(await c.get(h.id)).id for h in hs[::7]] == [h.id for h in hs[::7]]


def test_run_many_streams_calls_and_keeps_the_connection_in_step(
    redis_server: RedisServer,
) -> None:
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    s = _with(sc.SyncScripts(r), r)
    s._objs["boom"] = r.register_script("return redis.error_reply('BOOM ' .. ARGV[1])")
    assert s.run_many(sc.Call("echo", [], [str(i)]) for i in range(5)) == ["0", "1", "2", "3", "4"]
    r.script_flush()  # every call of the stream answers NOSCRIPT: each is run the usual way
    assert s.run_many(sc.Call("echo", [], [str(i)]) for i in range(3)) == ["0", "1", "2"]
    with pytest.raises(redis.ResponseError, match="BOOM x"):
        s.run(sc.Call("boom", [], ["x"]))
    calls = [sc.Call("echo", [], ["a"]), sc.Call("boom", [], ["y"]), sc.Call("echo", [], ["b"])]
    with pytest.raises(redis.ResponseError, match="BOOM y"):
        s.run_many(iter(calls))
    # Every reply of the failed stream was read: the next call gets its own answer.
    assert s.run(sc.Call("echo", [], ["next"])) == "next"
    # Each reply is handed over as it is read (a NOSCRIPT one after its rerun), every one once.
    seen: list[tuple[int, str]] = []
    calls4 = (sc.Call("echo", [], [str(i)]) for i in range(4))
    assert s.run_many(calls4, lambda k, v: seen.append((k, v))) == ["0", "1", "2", "3"]
    assert seen == [(0, "0"), (1, "1"), (2, "2"), (3, "3")]
    r.script_flush()
    seen.clear()
    s.run_many((sc.Call("echo", [], [str(i)]) for i in range(3)), lambda k, v: seen.append((k, v)))
    assert sorted(seen) == [(0, "0"), (1, "1"), (2, "2")]
    r.close()


def test_bulk_enqueue_in_parts(settings: Settings) -> None:
    from dtq.sdk.client import BULK_FIRST, BULK_PART, _bulk_parts

    n = BULK_PART * 4 + 17
    bounds = _bulk_parts(n)
    assert bounds[0] == (0, BULK_FIRST) and bounds[-1][1] == n
    assert all(a == b for (_, a), (b, _) in itertools.pairwise(bounds))  # contiguous, in order
    with Client(settings=settings) as c:
        c.enqueue("noop")  # registers the queue: the big batch takes the streamed path
        c.redis.script_flush()
        hs = c.enqueue_many([{"name": "noop", "args": [i]} for i in range(n)])
        assert len({h.id for h in hs}) == n and all(h.created for h in hs)
        # Handles come back in item order, each naming its own task.
        for i in (0, BULK_FIRST - 1, BULK_FIRST, BULK_PART, BULK_FIRST + BULK_PART, n - 1):
            assert c.get(hs[i].id).args == [i]
        assert sum(c.redis.xlen(st) for st in c.keys.queue("default").streams) == n + 1
        # One bad item anywhere: nothing is sent.
        items = [{"name": "noop"}] * (BULK_PART * 2) + [{"name": "noop", "priority": 10}]
        with pytest.raises(InvalidRequest):
            c.enqueue_many(items)
        assert sum(c.redis.xlen(st) for st in c.keys.queue("default").streams) == n + 1


@needs_lane
def test_bulk_after_a_restart_loses_no_part(fresh_redis: RedisServer, prefix: str) -> None:
    """The lane's socket died with the old server: found before the first part is sent, and
    every part goes the usual way; a send that fails outright loses no part either."""
    settings = make_settings(fresh_redis.url, prefix)
    n = 700

    def queued(c: Client) -> int:
        return sum(c.redis.xlen(st) for st in c.keys.queue("default").streams)

    with Client(settings=settings) as c:
        c.enqueue("noop")  # registers the queue: bulk batches take the streamed path
        assert len(c.enqueue_many([{"name": "noop"}] * n)) == n
        assert c._scripts.lane.connected  # the streamed bulk went over the lane
        fresh_redis.restart()  # no persistence: an empty server, and the lane's socket is dead
        hs = c.enqueue_many([{"name": "noop", "args": [i]} for i in range(n)])
        assert len(hs) == n and len({h.id for h in hs}) == n and queued(c) == n
        assert [c.get(hs[i].id).args for i in (0, 31, 32, n - 1)] == [[0], [31], [32], [n - 1]]
        # The first send itself fails (nothing reached Redis): that part runs too.
        lane = c._scripts.lane.connection()
        real_send = lane.send_packed_command

        def broken(*a: Any, **k: Any) -> None:
            lane.send_packed_command = real_send
            raise redis.ConnectionError("send failed")

        lane.send_packed_command = broken
        hs = c.enqueue_many([{"name": "noop", "args": [i]} for i in range(n)])
        assert len(hs) == n and queued(c) == 2 * n
        assert c.get(hs[0].id).args == [0]


@needs_lane
async def test_async_bulk_after_a_restart_loses_no_part(
    fresh_redis: RedisServer, prefix: str
) -> None:
    settings = make_settings(fresh_redis.url, prefix)
    n = 600
    async with AsyncClient(settings=settings) as c:
        assert len(await c.enqueue_many([{"name": "noop"}] * n)) == n
        assert c._scripts.lanes and c._scripts.lanes[0].connected  # streamed
        fresh_redis.restart()  # the lane's socket is dead, the server empty
        await asyncio.sleep(0.05)  # the loop sees the EOF
        items = [{"name": "noop", "args": [i]} for i in range(n)]

        async def queued() -> int:
            return sum([await c.redis.xlen(s) for s in c.keys.queue("default").streams])

        # The dead lane is found before anything is sent. The usual path may still meet another
        # dead pooled connection: the client re-sends (DTQ_CLIENT_RETRIES), and with retries
        # set to 0 the call raises and nothing was enqueued. Either way no part is lost or
        # doubled.
        try:
            hs = await c.enqueue_many(items)
        except RedisUnavailable:
            assert await queued() == 0
            hs = await c.enqueue_many(items)
        assert len(hs) == n and len({h.id for h in hs}) == n and await queued() == n
        assert (await c.get(hs[0].id)).args == [0] and (await c.get(hs[-1].id)).args == [n - 1]


@needs_lane
def test_enqueue_whose_reply_was_lost_is_answered_by_its_re_send(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection dies after Redis ran the enqueue, before its reply was read: the client
    sends the call again (the usual path), and enqueue.lua answers that re-send with the task
    the first send made. One task, one stream entry, a handle: not an error about a task that
    exists, and not a second copy."""
    read, lost = transport._read, []

    def read_then_lose(conn: Any) -> Any:
        reply = read(conn)  # the script ran and answered; the answer never arrives
        if not lost:
            lost.append(reply)
            raise redis.ConnectionError("connection reset after the call ran")
        return reply

    with Client(settings=settings) as c:
        c.enqueue("noop")  # registers the queue; the single enqueues below take the lane
        monkeypatch.setattr(transport, "_read", read_then_lose)
        for opts in ({}, {"idempotency_key": "k-lost"}, {"delay": 60}):
            lost.clear()
            h = c.enqueue("noop", **opts)
            assert lost and h.created and h.id.endswith(_text(lost[0][0]))
            assert h.status == ("scheduled" if "delay" in opts else "queued")
        qk = c.keys.queue("default")
        assert c.redis.xlen(qk.stream(5)) == 3  # the first enqueue and two re-sent ones
        assert c.redis.zcard(qk.sched) == 1


@needs_lane
async def test_async_enqueue_whose_reply_was_lost_is_answered_by_its_re_send(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    call, lost = transport.AsyncLane.call, []

    async def call_then_lose(lane: transport.AsyncLane, args: Any) -> Any:
        reply = await call(lane, args)
        if not lost and args[0] == "EVALSHA":
            lost.append(reply)
            await lane.drop()
            raise redis.ConnectionError("connection reset after the call ran")
        return reply

    async with AsyncClient(settings=settings) as c:
        await c.enqueue("noop")
        monkeypatch.setattr(transport.AsyncLane, "call", call_then_lose)
        h = await c.enqueue("noop")
        assert lost and h.created and h.status == "queued" and h.id.endswith(_text(lost[0][0]))
        assert await c.redis.xlen(c.keys.queue("default").stream(5)) == 2


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
