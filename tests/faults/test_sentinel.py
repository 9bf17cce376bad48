"""DTQ_REDIS_URL=redis+sentinel://...: clients and workers find the primary through Sentinel
and follow a failover."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client
from dtq.store.connection import parse_sentinel_url, sync_redis
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker, wait_until
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.slow


def test_parse_sentinel_url() -> None:
    s = parse_sentinel_url("redis+sentinel://:pw@a:26379,b:26380/mymaster/3")
    assert s.hosts == [("a", 26379), ("b", 26380)] and s.service == "mymaster"
    assert s.db == 3 and s.password == "pw"
    with pytest.raises(ValueError, match="names no service"):
        parse_sentinel_url("redis+sentinel://a:1")


class Sentinel:
    def __init__(self, tmp: Path, primary_port: int) -> None:
        self.port = free_port()
        conf = tmp / f"sentinel-{self.port}.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {tmp}\n"
            f"sentinel monitor mymaster 127.0.0.1 {primary_port} 1\n"
            "sentinel down-after-milliseconds mymaster 600\n"
            "sentinel failover-timeout mymaster 3000\n"
        )
        self.proc = subprocess.Popen(
            ["redis-server", str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        c = redis.Redis(port=self.port, decode_responses=True)
        wait_until(lambda: _answers(c), timeout=20)

    def primary(self) -> tuple[str, int]:
        c = redis.Redis(port=self.port, decode_responses=True)
        host, port = c.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")
        return host, int(port)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _answers(c: redis.Redis) -> bool:
    try:
        return bool(c.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster"))
    except redis.ConnectionError:
        return False


@pytest.fixture
def sentinel_setup(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, Sentinel]]:
    primary = RedisServer().start()
    replica = RedisServer()
    replica.extra_args = ["--replicaof", "127.0.0.1", str(primary.port)]
    replica.start()
    rc = replica.client()
    wait_until(lambda: rc.info("replication").get("master_link_status") == "up", timeout=20)
    s = Sentinel(tmp_path, primary.port)
    yield primary, replica, s
    s.stop()
    primary.cleanup()
    replica.cleanup()


async def test_worker_and_clients_follow_a_failover(
    sentinel_setup: tuple[RedisServer, RedisServer, Sentinel], prefix: str
) -> None:
    primary, replica, sentinel = sentinel_setup
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0"
    settings = make_settings(url, prefix, heartbeat_ttl_s=30)
    with Client(settings=settings) as c:
        h = c.enqueue("add", [1, 2])
        assert c.get(h.id).status.value == "queued"
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as ac:
        assert await ac.result(h.id, timeout=20) == 3
        # The primary dies; Sentinel promotes the replica; the worker and client follow.
        primary.stop()
        deadline = time.monotonic() + 30
        while sentinel.primary()[1] != replica.port:
            assert time.monotonic() < deadline, "sentinel did not fail over"
            await _sleep(0.1)
        h2 = await _retry(lambda: ac.enqueue("add", [20, 22]))
        assert await ac.result(h2.id, timeout=30) == 42
        assert replica.client().info("replication")["role"] == "master"


async def test_many_calls_at_once_wait_for_a_connection(
    sentinel_setup: tuple[RedisServer, RedisServer, Sentinel], prefix: str
) -> None:
    """As on one server (tests/sdk/test_result_waits.py): an AsyncClient's calls beyond its 100
    connections wait for one. Before, the 101st call at once over Sentinel failed at once
    ("Too many connections", redis-py's Sentinel pool has no blocking form)."""
    _, _, sentinel = sentinel_setup
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0"
    async with AsyncClient(settings=make_settings(url, prefix)) as c:
        h = await c.enqueue("add", [1, 2])
        infos = await asyncio.gather(*(c.get(h.id) for _ in range(300)))
    assert {i.id for i in infos} == {h.id}


async def test_clients_refuse_an_evicting_primary(
    sentinel_setup: tuple[RedisServer, RedisServer, Sentinel], prefix: str
) -> None:
    """Found through Sentinel, the primary's maxmemory-policy is checked as one server's is."""
    from dtq.errors import EvictingRedis

    primary, _, sentinel = sentinel_setup
    primary.client().config_set("maxmemory-policy", "allkeys-lru")
    settings = make_settings(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0", prefix)
    with Client(settings=settings) as c, pytest.raises(EvictingRedis, match="allkeys-lru"):
        c.enqueue("add", [1, 2])
    async with AsyncClient(settings=settings) as ac:
        with pytest.raises(EvictingRedis, match="allkeys-lru"):
            await ac.enqueue("add", [1, 2])
    assert primary.client().dbsize() == 0


def test_a_blocking_client_waits_for_a_connection(
    sentinel_setup: tuple[RedisServer, RedisServer, Sentinel],
) -> None:
    """The blocking client's pool over Sentinel: with its 100 connections taken, a call waits
    for one to come back instead of failing at once."""
    _, _, sentinel = sentinel_setup
    rc = sync_redis(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0",
                    wait_for_connection=True, decode_responses=True)  # fmt: skip
    pool = rc.connection_pool
    taken = [pool.get_connection() for _ in range(100)]
    threading.Timer(0.5, pool.release, [taken.pop()]).start()
    t0 = time.monotonic()
    assert rc.ping() is True
    assert time.monotonic() - t0 >= 0.4  # it waited for the one given back
    for conn in taken:
        pool.release(conn)
    rc.close()


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


async def _retry(fn: Any, attempts: int = 50) -> Any:
    for _ in range(attempts):
        try:
            return await fn()
        except Exception:  # the client sees the failover as a transient error
            await _sleep(0.2)
    return await fn()
