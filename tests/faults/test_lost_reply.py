"""A reply lost after Redis ran the command (the connection drops on the way back) must not
orphan the runs a claim started: an in-process worker reaches Redis through a proxy that drops
(or holds back) the reply of a chosen script call; a task with max_retries=0 must then run its
body exactly once and end succeeded, with no retry spent."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from dtq import App, AsyncClient, Settings, TaskStatus
from dtq import scripts as sc
from dtq.store.keys import Keys, split_task_id
from tests.chaos.proxy import Proxy
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer, free_port

DEADLINE_S = 20.0


@pytest.fixture
def proxy(redis_server: RedisServer, r: redis.Redis) -> Iterator[Proxy]:
    # Loaded beforehand: a first EVALSHA answered NOSCRIPT would not run (nor test anything).
    for name in ("claim", "complete"):
        r.script_load(sc.source(name))
    p = Proxy(free_port(), redis_server.port).start()
    yield p
    p.stop()


def sha(name: str) -> bytes:
    return hashlib.sha1(sc.source(name).encode()).hexdigest().encode()


def counting_app() -> tuple[App, list[tuple[str, int]]]:
    app = App()
    runs: list[tuple[str, int]] = []

    @app.task(name="lost.once", max_retries=0)
    async def once(n: int) -> int:
        from dtq import current_task

        ctx = current_task()
        runs.append((ctx.id, ctx.attempt))
        await asyncio.sleep(0.05)
        return n

    return app, runs


@contextlib.asynccontextmanager
async def setup(
    proxy: Proxy, redis_server: RedisServer, prefix: str, **kw: Any
) -> AsyncIterator[tuple[App, list[tuple[str, int]], Settings, AsyncClient]]:
    app, runs = counting_app()
    direct = make_settings(redis_server.url, prefix, **kw)
    async with AsyncClient(settings=direct, app=app) as client:
        yield (
            app,
            runs,
            make_settings(f"redis://127.0.0.1:{proxy.listen_port}/0", prefix, **kw),
            client,
        )


async def ended(client: AsyncClient, tid: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while loop.time() < end:
        info = await client.get(tid)
        if info.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            return info
        await asyncio.sleep(0.05)
    raise AssertionError(f"{tid} did not end: {await client.get(tid)}")


async def waited(event: Any, what: str) -> None:
    assert await asyncio.to_thread(event.wait, DEADLINE_S), what


def adopted(w: Any) -> float:
    return w.metrics.registry.get_sample_value("dtq_runs_adopted_total") or 0.0


def stale(w: Any) -> float:
    return w.metrics.registry.get_sample_value("dtq_stale_writes_total") or 0.0


def plain_claim(claim: bytes) -> Callable[[bytes], bool]:
    return lambda data: claim in data and b"XREAD" not in data


async def test_a_task_whose_claim_reply_is_lost_runs_once_and_succeeds(
    proxy: Proxy, redis_server: RedisServer, prefix: str
) -> None:
    async with setup(proxy, redis_server, prefix) as (app, runs, settings, client):
        h = await client.enqueue("lost.once", [1])
        rule = proxy.drop_reply_when(plain_claim(sha("claim")))
        async with running_worker(app, settings) as w:
            await waited(rule.fired, "the claim's reply was never dropped")
            info = await ended(client, h.id)
            assert info.status == TaskStatus.SUCCEEDED, info.error
            assert adopted(w) == 1
        assert (info.attempt, info.retries) == (1, 0)
        assert runs == [(h.id, 1)]


async def test_a_task_claimed_by_the_idle_pair_whose_reply_is_lost_runs_once(
    proxy: Proxy, redis_server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long block: the XREAD armed below must still be waiting when the task lands (a busy
    # machine could otherwise let a 1 s block end first, and its empty claim hide nothing).
    monkeypatch.setattr("dtq_worker.consumer.IDLE_BLOCK_MS", 4000)
    monkeypatch.setattr("dtq_worker.consumer.IDLE_WAIT_TIMEOUT_S", 6.0)
    async with setup(proxy, redis_server, prefix) as (app, runs, settings, client):
        async with running_worker(app, settings) as w:
            # The idle XREAD with the claim behind it: armed before the next pair goes out.
            rule = proxy.drop_reply_when(lambda d: sha("claim") in d and b"XREAD" in d)
            await waited(rule.matched, "no idle claim pair was sent")
            h = await client.enqueue("lost.once", [2])
            await waited(rule.fired, "the pair's reply was never dropped")
            info = await ended(client, h.id)
            assert info.status == TaskStatus.SUCCEEDED, info.error
            assert adopted(w) == 1
        assert (info.attempt, info.retries) == (1, 0)
        assert runs == [(h.id, 1)]


async def test_the_claim_inside_an_outcome_write_whose_reply_is_lost_runs_once(
    proxy: Proxy, redis_server: RedisServer, prefix: str
) -> None:
    """complete.lua stores run A and claims run B; its reply is lost. The re-sent complete is
    answered "stored" (not stale), and B, hidden from the worker, is found and run once."""
    async with setup(proxy, redis_server, prefix, worker_concurrency=1) as (
        app, runs, settings, client,
    ):  # fmt: skip
        a = await client.enqueue("lost.once", [1])
        b = await client.enqueue("lost.once", [2])
        rule = proxy.drop_reply_when(lambda d: sha("complete") in d)
        async with running_worker(app, settings) as w:
            await waited(rule.fired, "the outcome write's reply was never dropped")
            infos = [await ended(client, a.id), await ended(client, b.id)]
            for info in infos:
                assert info.status == TaskStatus.SUCCEEDED, info.error
                assert (info.attempt, info.retries) == (1, 0)
            assert adopted(w) == 1
            assert stale(w) == 0  # A's re-sent write was answered as stored
        assert sorted(runs) == sorted([(a.id, 1), (b.id, 1)])


async def test_recovery_never_starts_a_run_whose_claim_reply_is_only_slow(
    proxy: Proxy, redis_server: RedisServer, prefix: str
) -> None:
    """A claim's runs are running in Redis before its reply arrives: a recovery sent meanwhile
    would take them for lost ones, run them, and the late reply would start them again."""
    async with setup(proxy, redis_server, prefix) as (app, runs, settings, client):
        h = await client.enqueue("lost.once", [3])
        rule = proxy.hold_reply_when(plain_claim(sha("claim")))
        async with running_worker(app, settings) as w:
            await waited(rule.fired, "the claim's reply was never held")
            w.recovery.request("default")  # as a lost reply elsewhere, or the period, would
            # Long enough for a recovery that did not wait for the claim to run the body (a
            # few ms here); with the wait, nothing may start until the reply comes. Kept well
            # inside the tests' 1.5 s visibility timeout: a hold near it let a loaded machine
            # see the held run's lease lapse ("worker lost"), which is not what this tests.
            for _ in range(20):
                await asyncio.sleep(0.025)
                assert not runs, "the body started before its claim's reply came"
            rule.released.set()
            info = await ended(client, h.id)
            assert adopted(w) == 0
        assert info.status == TaskStatus.SUCCEEDED, info.error
        assert runs == [(h.id, 1)]


async def test_a_run_hidden_by_a_lost_reply_during_shutdown_goes_back_unspent(
    proxy: Proxy, redis_server: RedisServer, prefix: str, r: redis.Redis
) -> None:
    """The reply of a claim sent just before the stop is lost: the stopping worker finds the run
    and hands it back (no interruption, no retry spent) instead of leaving it to the reaper."""
    async with setup(proxy, redis_server, prefix) as (app, runs, settings, client):
        h = await client.enqueue("lost.once", [4])
        rule = proxy.hold_reply_when(plain_claim(sha("claim")))
        async with running_worker(app, settings) as w:
            await waited(rule.fired, "the claim's reply was never held")
            w.initiate_shutdown()
            proxy.cut()  # the held reply is lost with every link
            await asyncio.sleep(0.2)
            proxy.restore()
        info = await client.get(h.id)
        assert info.status == TaskStatus.QUEUED, (info.status, info.error)
        assert info.retries == 0 and runs == []
        queue, tid = split_task_id(h.id)
        rec = r.hgetall(Keys(prefix).queue(queue).task(tid))
        assert rec.get("intr", "0") == "0"
        assert adopted(w) == 1


async def test_launch_refuses_a_second_copy_of_a_run_it_holds(
    proxy: Proxy, redis_server: RedisServer, prefix: str
) -> None:
    """The second guard behind the recovery's wait: a run launched from another reply (here a
    recover.lua sent by hand while the claim's reply is held) is not started again, nor is the
    running copy cancelled, when the claim's reply brings it too."""
    app = App()
    runs: list[int] = []
    gate = asyncio.Event()

    @app.task(name="lost.gated", max_retries=0)
    async def gated() -> int:
        from dtq import current_task

        runs.append(current_task().attempt)
        await gate.wait()
        return 7

    direct = make_settings(redis_server.url, prefix)
    settings = make_settings(f"redis://127.0.0.1:{proxy.listen_port}/0", prefix)
    async with AsyncClient(settings=direct, app=app) as client:
        h = await client.enqueue("lost.gated")
        rule = proxy.hold_reply_when(plain_claim(sha("claim")))
        async with running_worker(app, settings) as w:
            await waited(rule.fired, "the claim's reply was never held")
            call = sc.recover_call(
                w.keys.queue("default"), w.worker_id, [], events_maxlen=0, since_ms=0
            )
            batch = sc.parse_claim("default", await sc.AsyncScripts(client.redis).run(call))
            assert len(batch.runs) == 1
            w.runs.launch(batch.runs[0])
            rule.released.set()
            loop = asyncio.get_running_loop()
            end = loop.time() + DEADLINE_S
            while w.slots.claiming and loop.time() < end:  # the claim's reply has been taken
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            gate.set()
            info = await ended(client, h.id)
        assert info.status == TaskStatus.SUCCEEDED, info.error
        assert runs == [1]
