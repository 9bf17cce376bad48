"""Partitioned queues (DTQ_QUEUE_PARTITIONS, dtq.store.partitions): one logical queue over several
hash tags. Bodies marked ``cluster`` run against one redis-server and the test cluster."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from dtq import AsyncClient, Client, TaskStatus
from dtq.errors import ConfigError, InvalidRequest
from dtq.settings import load_settings
from dtq.store import partitions as pt
from dtq.store.keys import Keys, QueueRef, make_task_id, split_task_id
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


def test_a_queue_ref_is_parsed_from_and_builds_the_physical_name() -> None:
    assert QueueRef.parse("bulk~12") == QueueRef("bulk", 12)
    assert QueueRef.parse("bulk") == QueueRef("bulk", 0)
    assert [QueueRef.parse(n).name for n in ("bulk", "bulk~3")] == ["bulk", "bulk~3"]
    assert QueueRef("bulk", 3).task_id("abc") == "bulk:abc~3"
    assert QueueRef("bulk").task_id("abc") == "bulk:abc"
    assert split_task_id(QueueRef("bulk", 3).task_id("abc")) == ("bulk~3", "abc")


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


def keys_for_each_partition(n: int) -> list[str]:
    """A partition key landing on each of ``n`` partitions, in partition order."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(pt.index(pt.place("bulk", n, f"k{i}")), f"k{i}")
        if len(found) == n:
            return [found[j] for j in range(n)]
    raise AssertionError("no key for some partition")


def started_partitions(r: Any, prefix: str) -> list[int]:
    return [pt.index(physical_of(tid)) for tid, _, _ in body_starts(r, prefix)]


@pytest.mark.cluster
async def test_a_worker_takes_from_every_partition_in_turn(
    backend: Any, prefix: str, r: Any
) -> None:
    """One slot and every partition full: successive claims start at successive partitions,
    so none waits for another to drain (a fixed order would run partition 0's ten first)."""
    s = parted(backend, prefix, worker_concurrency=1)
    async with AsyncClient(settings=s, app=app) as c:
        hs = [
            await c.enqueue("record", queue="bulk", partition_key=k)
            for k in keys_for_each_partition(4)
            for _ in range(10)
        ]
        async with running_worker(app, s):
            for h in hs[:12]:
                await c.result(h.id, timeout=20)
            wait_until_started(r, prefix, 12)
    first = started_partitions(r, prefix)[:12]
    assert Counter(first[:4]) == Counter(first[4:8]) == Counter(first[8:12]) == Counter(range(4))


def wait_until_started(r: Any, prefix: str, n: int) -> None:
    from tests.conftest import wait_until

    wait_until(lambda: len(body_starts(r, prefix)) >= n)


@pytest.mark.cluster
async def test_priorities_hold_within_a_partition(backend: Any, prefix: str, r: Any) -> None:
    s = parted(backend, prefix, worker_concurrency=1)
    async with AsyncClient(settings=s, app=app) as c:
        low = [await c.enqueue("record", queue="bulk", partition_key="k", priority=0)
               for _ in range(3)]  # fmt: skip
        high = [await c.enqueue("record", queue="bulk", partition_key="k", priority=9)
                for _ in range(3)]  # fmt: skip
        async with running_worker(app, s):
            for h in low + high:
                await c.result(h.id, timeout=20)
    order = [tid for tid, _, _ in body_starts(r, prefix)]
    assert order == [h.id for h in high] + [h.id for h in low]


@pytest.mark.cluster
async def test_two_workers_lose_nothing_and_start_nothing_twice(
    backend: Any, prefix: str, r: Any
) -> None:
    s = parted(backend, prefix)
    async with AsyncClient(settings=s, app=app) as c:
        hs = await c.enqueue_many([{"name": "record", "queue": "bulk"}] * 200)
        async with running_worker(app, s), running_worker(app, s.model_copy(
            update={"worker_id": s.worker_id + "-b"}
        )):  # fmt: skip
            for h in hs:
                assert (await c.get(h.id)).queue == "bulk"
                await c.result(h.id, timeout=30)
    starts = body_starts(r, prefix)
    assert sorted(t for t, _, _ in starts) == sorted(h.id for h in hs)
    assert {a for _, a, _ in starts} == {1}
    assert len({pt.index(physical_of(h.id)) for h in hs}) == 4


@pytest.mark.cluster
async def test_dlq_listings_and_metrics_show_one_queue(backend: Any, prefix: str) -> None:
    from prometheus_client import generate_latest

    from dtq.admin import Admin

    s = parted(backend, prefix)
    async with AsyncClient(settings=s, app=app) as c:
        hs = [await c.enqueue("fail_now", queue="bulk", max_retries=0) for _ in range(8)]
        async with running_worker(app, s) as w:
            for h in hs:
                with pytest.raises(Exception):  # noqa: B017 - any failure
                    await c.result(h.id, timeout=20)
            text = generate_latest(w.metrics.registry).decode()
        assert 'queue="bulk"' in text and "bulk~" not in text
    async with Admin(settings=s) as admin:
        assert await admin.queue_names() == ["bulk"]
        (q,) = await admin.list_queues()
        assert (q.name, q.dlq, q.queued) == ("bulk", 8, 0)
        assert await admin.dlq_count("bulk") == 8
        page = await admin.dlq_list(queue="bulk", limit=100)
        assert sorted(d["task_id"] for d in page.items) == sorted(h.id for h in hs)
        assert {d["queue"] for d in page.items} == {"bulk"}
        assert await admin.pause("bulk")
        assert (await admin.get_queue("bulk")).paused
        assert await admin.resume("bulk")
        res = await admin.dlq_requeue(queue="bulk")
        assert res.done == 8
        assert (await admin.get_queue("bulk")).queued == 8
        assert (await admin.purge("bulk")).done == 8


def test_dtq_refuses_a_count_mismatch_with_one_line_and_exit_2(
    settings: Any, prefix: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtq.cli import main

    with Client(settings=settings.model_copy(update={"queue_partitions": {"bulk": 4}})) as c:
        c.enqueue("add", [1, 2], queue="bulk")
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", prefix)
    monkeypatch.setenv("DTQ_QUEUE_PARTITIONS", "bulk=2")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["enqueue", "add", "--args", "[1, 2]", "--queue", "bulk"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "has 4 partition(s) in Redis" in err
    monkeypatch.setenv("DTQ_QUEUE_PARTITIONS", "bulk=4")
    with pytest.raises(SystemExit) as exc:
        main(["enqueue", "add", "--queue", "bulk", "--partition-key", "k", "--json"])
    assert exc.value.code == 0


async def test_the_http_api_enqueues_gets_and_cancels_a_partitioned_task(
    settings: Any,
) -> None:
    import httpx

    from dtq_api.app import create_app

    s = settings.model_copy(update={"queue_partitions": {"bulk": 4}})
    transport = httpx.ASGITransport(app=create_app(s))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        ids = []
        for i in range(4):
            r = await http.post("/api/v1/tasks", json={"name": "add", "queue": "bulk",
                                                       "args": [i, 1], "delay": 3600})  # fmt: skip
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        assert {pt.index(physical_of(i)) for i in ids} == {0, 1, 2, 3}
        for tid in ids:
            got = (await http.get(f"/api/v1/tasks/{tid}")).json()
            assert (got["id"], got["queue"], got["status"]) == (tid, "bulk", "scheduled")
            assert (await http.post(f"/api/v1/tasks/{tid}/cancel")).status_code == 200
        queues = (await http.get("/api/v1/queues")).json()
        assert [q["name"] for q in queues["items"] if q["name"].startswith("bulk")] == ["bulk"]
        page = (await http.get("/api/v1/tasks", params={"queue": "bulk", "limit": 2})).json()
        seen = [t["id"] for t in page["items"]]
        while page["next_cursor"]:
            page = (await http.get("/api/v1/tasks", params={
                "queue": "bulk", "limit": 2, "cursor": page["next_cursor"]})).json()  # fmt: skip
            seen += [t["id"] for t in page["items"]]
        assert sorted(seen) == sorted(ids)


def test_dtq_testing_runs_a_partitioned_queue() -> None:
    from dtq.testing import TestQueue

    with TestQueue(app, queue_partitions={"bulk": 3}) as tq:
        hs = [tq.client.enqueue("add", [i, 1], queue="bulk") for i in range(6)]
        assert {pt.index(physical_of(h.id)) for h in hs} == {0, 1, 2}
        ran = tq.drain()
        assert sorted(i.id for i in ran) == sorted(h.id for h in hs)
        assert [tq.client.result(h.id, timeout=1) for h in hs] == [i + 1 for i in range(6)]
        listed = tq.tasks(queue="bulk")
        assert len(listed) == 6 and {i.queue for i in listed} == {"bulk"}


@pytest.mark.cluster
async def test_a_workflow_on_a_partitioned_queue_runs_on_its_partition_0(
    backend: Any, prefix: str
) -> None:
    from dtq import chain, sig

    s = parted(backend, prefix)
    async with AsyncClient(settings=s, app=app) as c, running_worker(app, s):
        h = await c.enqueue_workflow(
            chain(sig("add", args=[1, 2], queue="bulk"), sig("add", args=[10], queue="bulk"))
        )
        assert await c.result(h.id, timeout=20) == 13
        info = await c.get(h.id)
        assert info.queue == "bulk" and {physical_of(st["id"]) for st in info.steps} == {"bulk"}


def test_a_limit_key_keeps_its_tasks_on_one_partition(settings: Any) -> None:
    """A fleet limit counts the runs of its key per queue slot: all of one key's tasks go to
    one partition, so the limit holds across the partitions."""
    from tests.apps import limited

    s = settings.model_copy(update={"queue_partitions": {"default": 4}})
    with Client(settings=s, app=limited.app) as c:
        for tenant in ("t1", "t2", "t3"):
            ids = [c.enqueue(limited.tenant_job, tenant).id for _ in range(6)]
            assert len({physical_of(i) for i in ids}) == 1
        spread = {physical_of(c.enqueue(limited.free_job, "x").id) for _ in range(4)}
        assert len(spread) == 4


@pytest.mark.cluster
def test_cancel_many_covers_every_partition(backend: Any, prefix: str) -> None:
    with Client(settings=parted(backend, prefix)) as c:
        hs = [c.enqueue("add", [i, 1], queue="bulk") for i in range(8)]
        assert c.cancel_many(queue="bulk").cancelled == 8
        assert {c.get(h.id).status for h in hs} == {TaskStatus.CANCELLED}


@pytest.mark.cluster
async def test_the_scan_listing_of_a_partitioned_queue_finds_every_partition(
    backend: Any, prefix: str
) -> None:
    from dtq.admin import Admin

    s = parted(backend, prefix)
    with Client(settings=s) as c:
        ids = [c.enqueue("add", [i, 1], queue="bulk", delay=60).id for i in range(8)]
        c.enqueue("add", [1, 1], queue="bulkier")
    async with Admin(settings=s) as admin:
        for status in (None, "scheduled"):
            seen: list[str] = []
            cursor = None
            while True:
                page = await admin.list_tasks(queue="bulk", status=status, cursor=cursor, limit=3)
                seen += [t["id"] for t in page.items]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert sorted(seen) == sorted(ids)


async def test_a_schedule_of_a_partitioned_queue_fires_and_runs(settings: Any, r: Any) -> None:
    from dtq.schedules import Schedule, add_schedule, list_schedules

    s = settings.model_copy(update={"queues": ("bulk",), "queue_partitions": {"bulk": 4}})
    with Client(settings=s) as c:
        add_schedule(c, Schedule(name="often", task="add", every=3600, args=[2, 2], queue="bulk"))
        qk = Keys(s.key_prefix).queue("bulk")
        sec, usec = r.time()
        r.zadd(qk.schedules_next, {"often": sec * 1000 + usec // 1000 - 1000})  # due now
    async with AsyncClient(settings=s) as ac, running_worker(app, s):
        for _ in range(2000):
            if r.hget(qk.schedules_last, "often"):
                break
            await asyncio.sleep(0.01)
        with Client(settings=s) as c:
            [listed] = list_schedules(c, "bulk")
        assert listed.last_task_id is not None
        assert await ac.result(listed.last_task_id, timeout=20) == 4


def test_a_queue_cap_covers_all_its_partitions() -> None:
    from dtq_worker.slots import Slots

    queues = pt.expand(["bulk", "other"], {"bulk": 3})
    slots = Slots(8, 0, {"bulk": 2}, 10.0, lambda run: None, pt.siblings(queues))
    slots.reserve("bulk~1", 1)
    slots.reserve("bulk~2", 1)
    assert [slots.free(q) for q in queues] == [0, 0, 0, 6]
    slots.reserve("bulk~2", -1)
    assert slots.free("bulk") == 1
