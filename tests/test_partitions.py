"""Partitioned queues (DTQ_QUEUE_PARTITIONS, dtq.partitions): one logical queue over several
hash tags. Bodies marked ``cluster`` run against one redis-server and the test cluster."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, TaskStatus
from dtq import partitions as pt
from dtq.errors import ConfigError, InvalidRequest
from dtq.keys import Keys, make_task_id, split_task_id
from dtq.settings import load_settings
from tests.apps.basic import app
from tests.conftest import body_starts, make_settings, running_worker
from tests.redis_cluster import RedisClusterFixture


def parted(backend: Any, prefix: str, n: int = 4, **kw: Any) -> Any:
    return make_settings(backend.url, prefix, queues=("bulk",), queue_partitions={"bulk": n}, **kw)


def physical_of(task_id: str) -> str:
    return split_task_id(task_id)[0]


def test_ids_name_the_logical_queue_and_carry_the_partition() -> None:
    assert make_task_id("bulk~3", "0190abc") == "bulk:0190abc~3"
    assert split_task_id("bulk:0190abc~3") == ("bulk~3", "0190abc")
    assert split_task_id("bulk:0190abc") == ("bulk", "0190abc")
    assert pt.logical("bulk~3") == "bulk" and pt.index("bulk~3") == 3 and pt.index("bulk") == 0
    assert pt.expand(["a", "bulk"], {"bulk": 3}) == ["a", "bulk", "bulk~1", "bulk~2"]
    order = ["a", "bulk", "bulk~1", "bulk~2", "z"]
    assert pt.poll_order(order, 1) == ["a", "bulk~1", "bulk~2", "bulk", "z"]
    assert pt.poll_order(order, 3) == order


def test_the_setting_is_parsed_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTQ_QUEUE_PARTITIONS", "bulk=4, other=2")
    assert load_settings().queue_partitions == {"bulk": 4, "other": 2}
    for bad, says in [("bulk", "queue=N"), ("bulk=0", "1 to 256"), ("b~x=2", "bad queue name")]:
        monkeypatch.setenv("DTQ_QUEUE_PARTITIONS", bad)
        with pytest.raises(ConfigError, match=says):
            load_settings()


@pytest.mark.cluster
def test_tasks_spread_evenly_and_a_key_stays_on_one_partition(backend: Any, prefix: str) -> None:
    with Client(settings=parted(backend, prefix)) as c:
        spread = Counter(physical_of(c.enqueue("add", [1, 2], queue="bulk").id) for _ in range(40))
        assert spread == {"bulk": 10, "bulk~1": 10, "bulk~2": 10, "bulk~3": 10}
        keyed = {physical_of(c.enqueue("add", [1, 2], queue="bulk", partition_key="k7").id)
                 for _ in range(10)}  # fmt: skip
        assert len(keyed) == 1
        many = c.enqueue_many(
            [{"name": "add", "args": [1, 2], "queue": "bulk", "partition_key": "k7"}] * 5
        )
        assert {physical_of(h.id) for h in many} == keyed
        h = c.enqueue("add", [1, 2], queue="bulk")
        assert h.queue == "bulk" and h.id.startswith("bulk:")
        info = c.get(h.id)
        assert info.queue == "bulk" and info.status is TaskStatus.QUEUED
        with pytest.raises(InvalidRequest, match="partition_key"):
            c.enqueue("add", [1, 2], queue="bulk", partition_key="")


@pytest.mark.cluster
def test_an_idempotency_key_finds_its_first_task_on_any_partition(
    backend: Any, prefix: str
) -> None:
    with Client(settings=parted(backend, prefix)) as c:
        first = c.enqueue("add", [1, 2], queue="bulk", idempotency_key="once")
        again = [c.enqueue("add", [1, 2], queue="bulk", idempotency_key="once") for _ in range(5)]
        assert {h.id for h in again} == {first.id}


def test_partitions_land_on_more_than_one_shard(
    redis_cluster: RedisClusterFixture, prefix: str
) -> None:
    keys = Keys(prefix)
    masters = {
        redis_cluster.master_of(keys.queue(q).streams[0]).port
        for q in pt.expand(["bulk"], {"bulk": 4})
    }
    assert len(masters) > 1
    with Client(settings=parted(redis_cluster, prefix)) as c:
        ids = [c.enqueue("add", [1, 2], queue="bulk").id for _ in range(8)]
    r = redis_cluster.client()
    try:
        where = {redis_cluster.master_of(keys.queue(physical_of(i)).task("x")).port for i in ids}
        assert where == masters
    finally:
        r.close()


@pytest.mark.cluster
async def test_a_worker_runs_every_partition_and_get_cancel_see_one_queue(
    backend: Any, prefix: str
) -> None:
    s = parted(backend, prefix)
    async with AsyncClient(settings=s, app=app) as c:
        late = await c.enqueue("add", [5, 5], queue="bulk", delay=3600, partition_key="p")
        assert await c.cancel(late.id)
        assert (await c.get(late.id)).status is TaskStatus.CANCELLED
        hs = [await c.enqueue("add", [i, 1], queue="bulk") for i in range(12)]
        async with running_worker(app, s):
            for i, h in enumerate(hs):
                assert await c.result(h.id, timeout=20) == i + 1
                info = await c.get(h.id)
                assert info.queue == "bulk" and info.attempt == 1


@pytest.mark.cluster
def test_a_count_mismatch_is_refused_while_tasks_wait(backend: Any, prefix: str) -> None:
    with Client(settings=parted(backend, prefix, n=4)) as c:
        c.enqueue("add", [1, 2], queue="bulk")
    for n in (2, 1):
        with (
            Client(settings=parted(backend, prefix, n=n)) as c,
            pytest.raises(ConfigError, match="has 4 partition.* gives " + str(n)),
        ):
            c.enqueue("add", [1, 2], queue="bulk")


@pytest.mark.cluster
def test_a_worker_with_another_count_refuses_to_start(
    backend: Any, prefix: str, spawn_worker: Any
) -> None:
    with Client(settings=parted(backend, prefix, n=4)) as c:
        c.enqueue("add", [1, 2], queue="bulk", delay=3600)
    w = spawn_worker(
        "tests.apps.basic:app", parted(backend, prefix), DTQ_QUEUES="bulk",
        DTQ_QUEUE_PARTITIONS="bulk=2",
    )  # fmt: skip
    assert w.wait() == 2
    assert "has 4 partition(s) in Redis but DTQ_QUEUE_PARTITIONS gives 2" in w.output()
    plain = spawn_worker("tests.apps.basic:app", parted(backend, prefix), DTQ_QUEUES="bulk")
    assert plain.wait() == 2  # unpartitioned: a count of 1


@pytest.mark.cluster
def test_an_empty_queue_takes_a_new_count(backend: Any, prefix: str) -> None:
    r: Any = backend.client()
    try:
        with Client(settings=parted(backend, prefix, n=4)) as c:
            h = c.enqueue("add", [1, 2], queue="bulk", delay=3600)
            assert r.hget(Keys(prefix).partitions, "bulk") == "4"
            assert c.cancel(h.id)  # nothing waits any more
        with Client(settings=parted(backend, prefix, n=2)) as c:
            c.enqueue("add", [1, 2], queue="bulk")
            assert r.hget(Keys(prefix).partitions, "bulk") == "2"
    finally:
        r.close()


_ = (asyncio, redis, body_starts)
