"""A blocking ``Client`` shared by many threads (a threaded web server's, say): calls beyond the
pool's 100 connections wait for one, and every ``result()`` wait of a client shares one
subscribed connection (dtq/sdk/donewait.py, SyncDoneWaits). Before, the 101st call at once raised
RedisUnavailable ("Too many connections"), and so did about the 50th ``result()`` wait (each
held a subscribed connection of its own, plus one per ``get``). Real redis-servers, a real
worker process, real threads."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from dtq import Client
from dtq.store.keys import Keys
from tests.conftest import make_settings, reap, wait_until
from tests.redis_server import RedisServer

N = 150


def _subscribers(backend: Any) -> list[int]:
    """The channel count of each connection subscribed to any (CLIENT LIST's sub=), on every
    node of a cluster (a subscription sits on one of them; there the done channels are sharded:
    ssub=)."""
    nodes = getattr(backend, "live_nodes", None)
    field = "sub" if nodes is None else "ssub"
    out = []
    for server in [backend] if nodes is None else nodes():
        with server.client() as r:
            out += [int(c[field]) for c in r.client_list() if int(c[field]) > 0]
    return out


def _client_channels(r: redis.Redis, prefix: str) -> list[str]:
    """The channels of ``prefix`` subscribed to, but the workers' cancel channel."""
    return [c for c in r.pubsub_channels(f"{prefix}*") if c != Keys(prefix).cancel_channel]


def _at_once(n: int, fn: Any) -> list[Any]:
    """``fn()`` in ``n`` threads let go together; what each returned (or raised)."""
    gate = threading.Barrier(n)

    def one() -> Any:
        gate.wait()
        try:
            return fn()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: one(), range(n)))


def test_many_threads_wait_for_a_connection(fresh_redis: RedisServer, prefix: str) -> None:
    """300 threads call at once while the server is stopped (SIGSTOP): each call holds its
    connection until the server answers, so all 300 are in flight together."""
    with Client(settings=make_settings(fresh_redis.url, prefix)) as c:
        h = c.enqueue("add", [1, 2])
        fresh_redis.pause()
        try:
            resume = threading.Timer(1.0, fresh_redis.resume)
            resume.start()
            got = _at_once(300, lambda: c.get(h.id))
        finally:
            resume.join()
            fresh_redis.resume()
    errors = [g for g in got if isinstance(g, Exception)]
    assert not errors, f"{len(errors)} calls failed, e.g. {errors[0]!r}"
    assert {g.id for g in got} == {h.id}


@pytest.mark.cluster
def test_many_result_waits_share_one_subscription(
    backend: Any, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(backend.url, prefix)
    r = backend.client()
    with Client(settings=s) as c:
        hs = [c.enqueue("add", [i, 1]) for i in range(N)]
        with ThreadPoolExecutor(N) as pool:
            waits = [pool.submit(c.result, h, 60) for h in hs]
            # One connection holds all N channels and the client's wake channel (a cluster's
            # reader has none: donewait.py), and none of the waits failed meanwhile.
            n = N + (0 if hasattr(backend, "live_nodes") else 1)
            wait_until(lambda: n in _subscribers(backend) or any(w.done() for w in waits))
            assert n in _subscribers(backend), [w.exception() for w in waits if w.done()][:1]
            spawn_worker("tests.apps.basic:app", s)
            assert [w.result(60) for w in waits] == [i + 1 for i in range(N)]
        # Every wait ended: its channel is given up (PUBSUB CHANNELS, which a cluster node
        # answers for its own clients only).
        wait_until(lambda: n not in _subscribers(backend), timeout=10)
        if isinstance(r, redis.Redis):
            wait_until(lambda: _client_channels(r, prefix) == [], timeout=10)
    r.close()


def test_result_waits_outlive_their_subscription_killed(
    fresh_redis: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    with Client(settings=s) as c:
        hs = [c.enqueue("add", [i, 1]) for i in range(20)]
        with ThreadPoolExecutor(20) as pool:
            waits = [pool.submit(c.result, h, 60) for h in hs]
            wait_until(lambda: _subscribers(fresh_redis) == [21], timeout=10)  # (and the wake)
            assert r.client_kill_filter(_type="pubsub") == 1
            spawn_worker("tests.apps.basic:app", s)
            assert [w.result(60) for w in waits] == [i + 1 for i in range(20)]
        # A wait after the kill subscribes again (a new connection) and is woken.
        h = c.enqueue("add", [5, 5])
        assert c.result(h, timeout=30) == 10
    r.close()


def test_a_timed_out_wait_gives_its_channel_up(redis_server: RedisServer, prefix: str) -> None:
    r = redis_server.client()
    with Client(settings=make_settings(redis_server.url, prefix)) as c:
        h = c.enqueue("add", [1, 1])
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.result(h.id, timeout=0.5)
        assert time.monotonic() - t0 < 5
        wait_until(lambda: _client_channels(r, prefix) == [], timeout=10)
    r.close()


def test_a_forked_child_waits_with_a_reader_of_its_own(
    redis_server: RedisServer, prefix: str
) -> None:
    """A pre-forking server forks while the parent's reader thread runs: the child's waits get
    a reader of their own (before, the child published to the parent's reader and was never
    subscribed, so it learned the outcome from its 5 s re-read only)."""
    r = redis_server.client()
    with Client(settings=make_settings(redis_server.url, prefix)) as c:
        never = c.enqueue("add", [0, 0])  # no worker runs: the parent's wait holds its reader
        parent = threading.Thread(target=lambda: _quiet(c.result, never.id, 20), daemon=True)
        parent.start()
        h = c.enqueue("add", [1, 1])
        queue, tid = h.id.split(":", 1)
        channel = c.keys.queue(queue).done_channel(tid)
        held = c.keys.queue(queue).done_channel(never.id.split(":", 1)[1])
        wait_until(lambda: r.pubsub_numsub(held)[0][1] == 1)
        pid = os.fork()
        if pid == 0:  # the child: its result() must be woken by the announcement
            code = 1
            try:
                code = 0 if c.result(h.id, timeout=30) == 2 else 3
            finally:
                os._exit(code)
        try:
            # The child's reader subscribed the channel; then the task ends and is announced.
            wait_until(lambda: r.pubsub_numsub(channel)[0][1] == 1, timeout=10)
            r.hset(c.keys.queue(queue).task(tid), mapping={"status": "succeeded", "result": "2"})
            r.publish(channel, "succeeded")
        finally:
            code = reap(pid)
        assert code == 0
    r.close()


def _quiet(fn: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # (the wait ends with the test, timed out)
        fn(*args)
