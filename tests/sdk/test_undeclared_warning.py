"""A client enqueueing a task BY NAME warns once (``dtq.UndeclaredTaskWarning``) when no live
worker declares the name, or when no live worker consumes the queue, as ``dtq enqueue`` says on
stderr. Through a task object it never warns. The check costs one round trip per (client,
queue, name) per DECLARED_EVERY_S, never one per task."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from dtq import App, AsyncClient, Client, Settings, UndeclaredTaskWarning
from dtq.store.connection import async_redis
from dtq.store.keys import QueueKeys
from tests.conftest import make_settings, running_worker
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

app = App()


@app.task(name="warn.known")
def known(x: int = 0) -> int:
    return x


NO_CONSUMER = "no live worker consumes queue 'default': the task waits for one"
NOT_DECLARED = (
    "no live worker of queue 'default' declares task 'warn.nosuch': it waits, and fails on "
    "the worker that takes it"
)


@contextmanager
def undeclared() -> Iterator[list[str]]:
    """The messages of the UndeclaredTaskWarnings raised in the block (every one: no dedup by
    Python's filters, so the client's own once-only rule is what is tested)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out: list[str] = []
        yield out
    out.extend(str(w.message) for w in caught if w.category is UndeclaredTaskWarning)


async def stamped(settings: Settings, queue: str, name: str) -> None:
    """Wait (bounded) until a worker stamped ``name`` as declared for ``queue``."""
    r = async_redis(settings.redis_url, decode_responses=True)
    try:
        key = QueueKeys(settings.key_prefix, queue).decl_seen
        for _ in range(500):
            if await r.hexists(key, name):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no worker stamped {name} in {key}")
    finally:
        await r.aclose()


@pytest.mark.cluster
def test_no_worker_warns_once_for_two_enqueues_of_one_name(settings: Settings) -> None:
    with Client(settings=settings) as c, undeclared() as msgs:
        c.enqueue("warn.nosuch", [1])
        c.enqueue("warn.nosuch", [2])
    assert msgs == [NO_CONSUMER]


def test_the_warning_is_a_user_warning_pytest_sees_at_the_callers_line(
    settings: Settings,
) -> None:
    with (
        Client(settings=settings) as c,
        pytest.warns(UndeclaredTaskWarning, match=NO_CONSUMER) as w,
    ):
        c.enqueue("warn.nosuch")
        c.enqueue_many([{"name": "warn.other"}])
    assert issubclass(UndeclaredTaskWarning, UserWarning)
    assert [x.filename for x in w] == [__file__, __file__]  # (stacklevel: the enqueue's caller)


async def test_the_async_warning_points_at_the_callers_line(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        with pytest.warns(UndeclaredTaskWarning, match=NO_CONSUMER) as w:
            await c.enqueue("warn.nosuch")
            await c.enqueue_many([{"name": "warn.other"}])
    assert [x.filename for x in w] == [__file__, __file__]


@pytest.mark.cluster
async def test_async_client_no_worker_warns_once(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        with undeclared() as msgs:
            await asyncio.gather(*(c.enqueue("warn.nosuch", [i]) for i in range(5)))
            await c.enqueue("warn.nosuch")
    assert msgs == [NO_CONSUMER]


@pytest.mark.cluster
async def test_a_live_worker_declaring_the_name_means_no_warning(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        await stamped(settings, "default", "warn.known")
        with undeclared() as msgs:
            h = await c.enqueue("warn.known", [3])
            assert await c.result(h.id, timeout=20) == 3
    assert msgs == []


@pytest.mark.cluster
async def test_a_live_worker_not_declaring_the_name_warns_does_not_declare(
    settings: Settings,
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        await stamped(settings, "default", "warn.known")
        with undeclared() as msgs:
            await c.enqueue("warn.nosuch")
            await c.enqueue("warn.known")
            await c.enqueue("warn.nosuch")
    assert msgs == [NOT_DECLARED]


def test_a_task_object_never_warns(settings: Settings) -> None:
    app.configure(settings)
    with Client(settings=settings, app=app) as c, undeclared() as msgs:
        c.enqueue(known, 1)
        known.enqueue(2)
    assert msgs == []


def test_enqueue_many_warns_once_per_distinct_name(settings: Settings) -> None:
    items = [{"name": n, "args": [i]} for i, n in enumerate(["warn.a", "warn.b", "warn.a"] * 3)]
    with Client(settings=settings) as c, undeclared() as msgs:
        c.enqueue_many(items)
        c.enqueue_many(items)
        c.enqueue("warn.b")
    assert msgs == [NO_CONSUMER, NO_CONSUMER]  # warn.a's and warn.b's


async def test_async_enqueue_many_warns_the_does_not_declare_wording(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        await stamped(settings, "default", "warn.known")
        with undeclared() as msgs:
            await c.enqueue_many([{"name": "warn.known"}, {"name": "warn.nosuch"}] * 2)
    assert msgs == [NOT_DECLARED]


@pytest.mark.cluster
async def test_a_partitioned_queue_reads_the_stamps_of_the_partition_enqueued_to(
    backend: RedisServer | RedisClusterFixture, prefix: str
) -> None:
    settings = make_settings(backend.url, prefix, queue_partitions={"default": 3})
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        for q in ("default", "default~1", "default~2"):
            await stamped(settings, q, "warn.known")
        with undeclared() as msgs:
            hs = [await c.enqueue("warn.known", partition_key=str(k)) for k in range(12)]
            await c.enqueue("warn.nosuch", partition_key="7")
    assert {h.id.rpartition("~")[2] for h in hs if "~" in h.id} == {"1", "2"}
    assert msgs == [NOT_DECLARED]


def test_the_setting_turns_the_check_off(settings: Settings) -> None:
    off = settings.model_copy(update={"client_warn_undeclared": False})
    with Client(settings=off) as c, undeclared() as msgs:
        c.enqueue("warn.nosuch")
        c.enqueue_many([{"name": "warn.other"}])
    assert msgs == []


def test_the_check_is_one_read_per_client_queue_and_name_not_one_per_task(
    fresh_redis: RedisServer, prefix: str
) -> None:
    settings = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    try:
        with Client(settings=settings) as c, undeclared() as msgs:
            c.enqueue("warn.nosuch")  # registers the queue, then checks: one read
            r.config_resetstat()
            for i in range(20):
                c.enqueue("warn.nosuch", [i])
                c.enqueue_many([{"name": "warn.nosuch"}, {"name": "warn.nosuch"}])
            c.enqueue("warn.other")  # a new name: one read
            stats = r.info("commandstats")
        assert msgs == [NO_CONSUMER, NO_CONSUMER]
        assert stats["cmdstat_hgetall"]["calls"] == 1
    finally:
        r.close()


def test_a_check_redis_cannot_answer_leaves_the_enqueue_alone(
    settings: Settings, r: redis.Redis
) -> None:
    r.set(QueueKeys(settings.key_prefix, "default").decl_seen, "not a hash")  # WRONGTYPE
    with Client(settings=settings) as c, undeclared() as msgs:
        h = c.enqueue("warn.nosuch")
        assert c.get(h.id).status == "queued"
    assert msgs == []
