"""Fair groups at enqueue: every path that makes a task carries ``group`` to the record's ``grp``
field and ``get()`` shows it; a bad group is refused in one place (dtq.sdk.requests) with one line;
a partitioned queue keeps a group in one partition; DTQ_GROUP_CONCURRENCY is parsed."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from dtq import (
    App,
    AsyncClient,
    Client,
    ConfigError,
    InvalidRequest,
    Settings,
    chain,
    group,
    sig,
)
from dtq.cli import main
from dtq.schedules import Schedule, ScheduleRunner, add_schedule, arun_now, list_schedules
from dtq.settings import load_settings
from dtq.store import partitions
from dtq.store.keys import Keys, split_task_id
from dtq.store.record import Field
from dtq_api.app import create_app
from tests.conftest import running_worker

# Most tests enqueue with no worker running: the client's warning about that is expected.
pytestmark = pytest.mark.filterwarnings("ignore::dtq.UndeclaredTaskWarning")

app = App()


@app.task(name="grp.work", queue="default")
def work(x: int) -> int:
    return x


class Records:
    """The test's task records, read directly (what the scripts stored)."""

    def __init__(self, settings: Settings) -> None:
        self.keys = Keys(settings.key_prefix)
        self.r = redis.Redis.from_url(settings.redis_url, decode_responses=True)

    def grp(self, task_id: str) -> str | None:
        """The ``grp`` field of the task's record."""
        q, tid = split_task_id(task_id)
        return self.r.hget(self.keys.queue(q).task(tid), Field.GROUP)  # type: ignore[return-value]


@pytest.fixture
def rec(settings: Settings) -> Any:
    records = Records(settings)
    yield records
    records.r.close()


@pytest.fixture
def client(settings: Settings) -> Any:
    with Client(settings=settings, app=app) as c:
        yield c


# --- each enqueue path -------------------------------------------------------------------


def test_sync_client_by_name_and_by_task_object(client: Client, rec: Records) -> None:
    h = client.enqueue("grp.work", [1], group="acme")
    assert rec.grp(h.id) == "acme" and client.get(h.id).group == "acme"
    h = client.enqueue(work.options(group="globex"), 2)  # task.options
    assert rec.grp(h.id) == "globex" and client.get(h.id).group == "globex"
    h = client.enqueue("grp.work", [3], group="acme", delay=60)  # a delayed task too
    assert rec.grp(h.id) == "acme" and client.get(h.id).status == "scheduled"
    for plain in (client.enqueue("grp.work", [4]), client.enqueue("grp.work", [5], group="")):
        assert not rec.grp(plain.id) and client.get(plain.id).group is None


async def test_async_client(settings: Settings, rec: Records) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("grp.work", [1], group="tenant-7")
        assert rec.grp(h.id) == "tenant-7" and (await c.get(h.id)).group == "tenant-7"
        h = await c.enqueue(work.options(group="über Kunde"), 2)
        assert (await c.get(h.id)).group == "über Kunde"
        [a, b] = await c.enqueue_many(
            [{"name": "grp.work", "args": [3], "group": "x"}, {"name": "grp.work", "args": [4]}]
        )
        assert (await c.get(a.id)).group == "x" and (await c.get(b.id)).group is None


def test_enqueue_many_items(client: Client, rec: Records) -> None:
    items = [{"name": "grp.work", "args": [i], "group": f"g{i % 3}"} for i in range(9)]
    items.append({"name": "grp.work", "args": [9]})
    hs = client.enqueue_many(items)
    # (an ungrouped task's grp is absent, or '' while the queue has active groups)
    assert [rec.grp(h.id) or None for h in hs] == [f"g{i % 3}" for i in range(9)] + [None]
    assert [client.get(h.id).group for h in hs[:3]] == ["g0", "g1", "g2"]


def test_task_enqueue_shortcut_with_options(settings: Settings, rec: Records) -> None:
    app.configure(settings)
    h = work.options(group="short").enqueue(1)
    assert rec.grp(h.id) == "short"
    h = work.options(group="with", delay=30).enqueue(2)
    assert rec.grp(h.id) == "with"


def test_before_enqueue_middleware_keeps_the_group(settings: Settings, rec: Records) -> None:
    class Stamp:
        def before_enqueue(self, req: Any) -> None:
            req.metadata["seen"] = True

    mw_app = App(settings)
    mw_app.add_middleware(Stamp())
    with Client(settings=settings, app=mw_app) as c:
        h = c.enqueue("grp.work", [1], group="mw")
        [m] = c.enqueue_many([{"name": "grp.work", "args": [2], "group": "mw2"}])
        info = c.get(h.id)
        assert info.group == "mw" and info.metadata == {"seen": True}
        assert c.get(m.id).group == "mw2"


# --- validation: one place, one line -----------------------------------------------------

BAD_GROUPS = [
    "x" * 129,
    "a\nb",
    "tab\there",
    "nul\x00",
    "line\u2028sep",
    "c1\x85control",
    "lone\ud800",  # a lone surrogate: not UTF-8
    5,
    b"bytes",
]


@pytest.mark.parametrize("bad", BAD_GROUPS)
def test_a_bad_group_is_refused_in_one_line_before_anything_is_stored(
    client: Client, rec: Records, bad: Any
) -> None:
    qk = Keys(client.settings.key_prefix).queue("default")
    with pytest.raises(InvalidRequest) as e1:
        client.enqueue("grp.work", [1], group=bad)
    with pytest.raises(InvalidRequest) as e2:
        client.enqueue_many([{"name": "grp.work", "args": [1]}, {"name": "grp.work", "group": bad}])
    with pytest.raises(InvalidRequest) as e3:
        client.enqueue(work.options(group=bad), 1)
    with pytest.raises(InvalidRequest) as e4:
        client.enqueue_workflow(chain(sig("grp.work", [1], group=bad)))
    with pytest.raises(InvalidRequest) as e5:
        Schedule(name="s", task="grp.work", every=60, group=bad)
    for e in (e1, e2, e3, e4, e5):
        text = str(e.value)
        assert "group" in text and "\n" not in text and "\u2028" not in text, text
    assert not list(rec.r.scan_iter(qk.task_pattern))  # nothing was stored


@pytest.mark.parametrize(
    "good", ["a", "x" * 128, "acme corp", "租户-42", "a:b{c}/d", "zero\u200bwidth", "\U000660e0"]
)
def test_good_groups_are_stored_as_given(client: Client, good: str) -> None:
    assert client.get(client.enqueue("grp.work", [1], group=good).id).group == good


# --- partitioned queues: a group lives in one partition -----------------------------------


def test_a_group_goes_to_its_partition_unless_a_key_places_it(settings: Settings) -> None:
    s = settings.model_copy(update={"queue_partitions": {"bulk": 4}})
    with Client(settings=s) as c:
        hs = c.enqueue_many([{"name": "grp.work", "queue": "bulk", "group": "acme"}] * 12)
        want = partitions.place("bulk", 4, "acme")
        assert {split_task_id(h.id)[0] for h in hs} == {want}
        plain = c.enqueue_many([{"name": "grp.work", "queue": "bulk"}] * 8)  # round-robin
        assert len({split_task_id(h.id)[0] for h in plain}) == 4
        # partition_key, then an idempotency key, place a grouped task before its group.
        for key in ("k1", "k2", "k3", "k4", "k5"):
            h = c.enqueue("grp.work", queue="bulk", group="acme", partition_key=key)
            assert split_task_id(h.id)[0] == partitions.place("bulk", 4, key)
            h = c.enqueue("grp.work", queue="bulk", group="acme", idempotency_key=key)
            assert split_task_id(h.id)[0] == partitions.place("bulk", 4, key)
            assert c.get(h.id).group == "acme"


# --- the HTTP API ------------------------------------------------------------------------


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


async def test_api_post_takes_a_group_and_the_task_shows_it(
    http: httpx.AsyncClient, rec: Records
) -> None:
    r = await http.post("/api/v1/tasks", json={"name": "add", "args": [1, 2], "group": "acme"})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["group"] == "acme" and rec.grp(t["id"]) == "acme"
    assert (await http.get(f"/api/v1/tasks/{t['id']}")).json()["group"] == "acme"
    r = await http.post("/api/v1/tasks", json={"name": "add", "args": [1, 2]})
    assert r.json()["group"] is None and not rec.grp(r.json()["id"])
    schema = (await http.get("/openapi.json")).json()["components"]["schemas"]
    assert schema["EnqueueRequest"]["properties"]["group"]["anyOf"][0]["maxLength"] == 128
    assert "group" in schema["Task"]["properties"]


@pytest.mark.parametrize("bad", ["x" * 129, "a\nb", "", "c1\x85", 5, ["a"]])
async def test_api_refuses_a_bad_group_with_422(http: httpx.AsyncClient, bad: Any) -> None:
    r = await http.post("/api/v1/tasks", json={"name": "add", "group": bad})
    assert r.status_code == 422, r.text
    msg = r.json()["error"]["message"]
    assert "group" in msg and "\n" not in msg and "Extra inputs" not in msg, msg


# --- the CLI -----------------------------------------------------------------------------


def dtq_cli(monkeypatch: Any, capsys: Any, settings: Settings, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_cli_enqueue_group_and_task_shows_it(
    settings: Settings, rec: Records, monkeypatch: Any, capsys: Any
) -> None:
    code, out, err = dtq_cli(monkeypatch, capsys, settings, "enqueue", "add", "1", "2",
                             "--group", "acme", "--json")  # fmt: skip
    assert code == 0, err
    tid = json.loads(out)["id"]
    assert rec.grp(tid) == "acme"
    code, out, _ = dtq_cli(monkeypatch, capsys, settings, "task", tid, "--no-history")
    assert code == 0 and "group: acme" in out
    code, out, _ = dtq_cli(monkeypatch, capsys, settings, "task", tid, "--json")
    assert json.loads(out)["group"] == "acme"
    code, out, _ = dtq_cli(monkeypatch, capsys, settings, "enqueue", "add", "--json")
    plain = json.loads(out)["id"]
    code, out, _ = dtq_cli(monkeypatch, capsys, settings, "task", plain, "--no-history")
    assert "group" not in out


@pytest.mark.parametrize("bad", ["a\nb", "x" * 129])
def test_cli_refuses_a_bad_group_with_exit_2(
    settings: Settings, monkeypatch: Any, capsys: Any, bad: str
) -> None:
    code, out, err = dtq_cli(monkeypatch, capsys, settings, "enqueue", "add", "--group", bad)
    assert code == 2 and out == ""
    assert err.startswith("error: group") and err.count("\n") == 1, err


# --- workflow steps ----------------------------------------------------------------------


async def test_workflow_steps_carry_their_group_to_their_records(
    settings: Settings, rec: Records
) -> None:
    """Each way a step's record is made: a first step at home (flow_enqueue), a first step on
    another queue (flow_put, by the client), a released step at home and on another queue
    (flow_release, then flow_put by a worker's mover)."""
    from tests.apps.flows import app as flows_app

    both = settings.model_copy(update={"queues": ["default", "other"]})
    flow = chain(
        group(sig("add", [1, 2], group="g0"), sig("double", [5], group="g1")),
        sig("sum", group="g2"),
        sig("double", group="g3"),
        sig("add", [1]),
    )
    async with running_worker(flows_app, both), AsyncClient(settings=both, app=flows_app) as c:
        h = await c.enqueue_workflow(flow)
        assert await c.result(h.id, timeout=20) == 27  # sum([3, 10]) * 2 + 1
        info = await c.get(h.id)
        assert info.steps is not None
        ids = [s["id"] for s in info.steps]
        assert [split_task_id(i)[0] for i in ids] == ["default", "other", "default", "other",
                                                      "default"]  # fmt: skip
        assert [rec.grp(i) or None for i in ids] == ["g0", "g1", "g2", "g3", None]
        assert [(await c.get(i)).group for i in ids] == ["g0", "g1", "g2", "g3", None]


def test_a_step_takes_group_as_an_option() -> None:
    assert sig("add", [1], group="acme").options == {"group": "acme"}
    with pytest.raises(InvalidRequest, match="not allowed"):
        sig("add", [1], partition_key="k")


# --- schedules ---------------------------------------------------------------------------


async def test_a_schedule_fires_its_tasks_in_its_group(
    settings: Settings, client: Client, rec: Records
) -> None:
    from redis.asyncio import Redis as AsyncRedis

    from dtq import scripts as sc

    add_schedule(client, Schedule(name="tick", task="grp.work", every=60, args=[1], group="acme"))
    add_schedule(client, Schedule(name="plain", task="grp.work", every=60, args=[2]))
    [listed] = [i for i in list_schedules(client) if i.schedule.name == "tick"]
    assert listed.schedule.group == "acme" and listed.to_dict()["group"] == "acme"
    qk = Keys(settings.key_prefix).queue("default")
    stored = rec.r.hgetall(qk.schedules)
    assert '"group"' not in stored["plain"]  # a definition without a group reads as before
    due = int(rec.r.time()[0]) * 1000 - 1000  # type: ignore[index]
    rec.r.zadd(qk.schedules_next, {"tick": due, "plain": due})
    ar = AsyncRedis.from_url(settings.redis_url, decode_responses=True)
    try:
        runner = ScheduleRunner(ar, sc.AsyncScripts(ar), Keys(settings.key_prefix), settings, app)
        await runner.tick("default")
        async with AsyncClient(settings=settings) as ac:
            now_id = await arun_now(ac, "tick", "default")  # run-now keeps the group too
    finally:
        await ar.aclose()
    last = rec.r.hgetall(qk.schedules_last)
    fired = client.get(f"default:{last['tick']}")
    assert fired.group == "acme" and fired.metadata["schedule"] == "tick"
    assert rec.grp(fired.id) == "acme"
    assert client.get(f"default:{last['plain']}").group is None
    assert client.get(now_id).group == "acme"


def test_periodic_declares_a_group() -> None:
    from dtq.schedules import declared

    a = App()

    @a.periodic(every=30, group="nightly")
    def job() -> None: ...

    [s] = declared(a)
    assert s.group == "nightly" and json.loads(s.to_json())["group"] == "nightly"
    assert Schedule.from_json(s.to_json()) == s


# --- dtq.testing -------------------------------------------------------------------------


def test_testing_helper_stores_and_shows_the_group() -> None:
    from dtq.testing import TestQueue

    t_app = App()

    @t_app.task(name="t.job")
    def job(x: int) -> int:
        return x

    with TestQueue(t_app) as tq:
        job.options(group="acme").enqueue(1)
        tq.client.enqueue("t.job", [2], group="globex")
        tq.client.enqueue_many([{"name": "t.job", "args": [3], "group": "acme"}])
        job.enqueue(4)
        assert len(tq.assert_enqueued("t.job", group="acme")) == 2
        tq.assert_enqueued("t.job", [2], group="globex", count=1)
        with pytest.raises(AssertionError, match="group='none'"):
            tq.assert_enqueued("t.job", group="none")
        ran = tq.drain()
        assert sorted((i.args[0], i.group) for i in ran) == [
            (1, "acme"), (2, "globex"), (3, "acme"), (4, None),
        ]  # fmt: skip
        assert all(i.status == "succeeded" for i in ran)


def test_testing_helper_drains_a_lone_groups_backlog() -> None:
    """A group alone in its queue drains in the helper, each task once and in order (the
    helper claims one run at a time: the group's turn passes on at each start)."""
    from dtq.testing import TestQueue

    t_app = App()

    @t_app.task(name="t.solo")
    def solo(x: int) -> int:
        return x

    with TestQueue(t_app) as tq:
        for i in range(40):
            solo.options(group="acme").enqueue(i)
        ran = tq.drain()
        assert [i.args[0] for i in ran] == list(range(40))
        assert all(i.status == "succeeded" and i.group == "acme" for i in ran)


# --- DTQ_GROUP_CONCURRENCY -----------------------------------------------------------------


def test_group_concurrency_setting_parses_pairs(monkeypatch: Any) -> None:
    assert load_settings().group_concurrency == {}
    assert load_settings(group_concurrency="tenants=4, reports=1").group_concurrency == {
        "tenants": 4, "reports": 1,
    }  # fmt: skip
    monkeypatch.setenv("DTQ_GROUP_CONCURRENCY", "q=2")
    assert load_settings().group_concurrency == {"q": 2}


@pytest.mark.parametrize("bad", ["q=0", "q=-1", "q", "=3", "q=x", "q=1.5", "bad name=2"])
def test_group_concurrency_setting_refuses_bad_input(bad: str) -> None:
    with pytest.raises(ConfigError, match="DTQ_GROUP_CONCURRENCY") as e:
        load_settings(group_concurrency=bad)
    assert "\n" not in str(e.value)
