"""Fair groups' operator surfaces (dtq.sdk.groupops, dtq.admin.groups, the API, the CLI, the
exporter): the listing's numbers from group state written key by key, hold and release through
the SDK, the API and the CLI, a partitioned queue's groups merged, and the page's bound."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from dtq import AsyncClient, Client, Settings
from dtq.admin import Admin
from dtq.errors import InvalidRequest
from dtq.models import GroupInfo
from dtq.sdk import groupops as go
from dtq.store.keys import Keys, QueueKeys
from dtq_api.app import create_app
from dtq_api.metrics import render
from tests.api_proc import ApiProc
from tests.helpers import browser as dash

Q = "gq"


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


class Groups:
    """Writes a queue's group state the way the turn logic keeps it (keys.py, QueueKeys.group_*)."""

    def __init__(self, r: redis.Redis, qk: QueueKeys) -> None:
        self.r, self.qk, self.n = r, qk, 0
        self.now = redis_ms(r)

    def _task(self, group: str, status: str, enq_ms: int) -> str:
        self.n += 1
        tid = f"{self.now:012x}{self.n:016x}"
        self.r.hset(self.qk.task(tid), mapping={"status": status, "grp": group, "enq": enq_ms})
        return tid

    def waiting(self, group: str, band: int, n: int, age_s: float) -> None:
        """``n`` waiting tasks of ``group`` in ``band``, in the group's list (its head the
        turn), the turn enqueued ``age_s`` ago, the others after it."""
        enq = self.now - int(age_s * 1000)
        tids = [self._task(group, "queued", enq + i) for i in range(n)]
        if tids:
            self.r.rpush(self.qk.group_waiting(band, group), *tids)
        self.active(group)

    def running(self, group: str, n: int) -> None:
        for _ in range(n):
            self._task(group, "running", 0)
            self.r.incr(self.qk.group_running(group))
        self.active(group)

    def active(self, group: str, since: int | None = None) -> None:
        score = since if since is not None else self.r.zcard(self.qk.group_index) + 1
        self.r.zadd(self.qk.group_index, {group: score}, nx=True)

    def held(self, group: str) -> None:
        self.r.sadd(self.qk.group_paused, group)


@pytest.fixture
def keys(settings: Settings, r: redis.Redis) -> Keys:
    k = Keys(settings.key_prefix)
    r.sadd(k.queues, Q)  # a known queue (the admin's 404 otherwise)
    return k


@pytest.fixture
def client(settings: Settings) -> Any:
    with Client(settings=settings) as c:
        yield c


def by_name(items: list[GroupInfo]) -> dict[str, GroupInfo]:
    return {g.group: g for g in items}


# --- the listing's numbers ----------------------------------------------------------------


def test_the_listing_counts_waiting_running_held_and_the_oldest_age(
    r: redis.Redis, keys: Keys, client: Client
) -> None:
    g = Groups(r, keys.queue(Q))
    g.waiting("acme", 5, 4, age_s=30)  # a turn and 3 behind it
    g.waiting("acme", 0, 2, age_s=100)  # another band: its turn is the older one
    g.running("acme", 2)
    g.running("beta", 1)  # running only: active, nothing waiting
    g.held("beta")
    g.waiting("", 9, 1, age_s=5)  # the ungrouped tasks, a group of their own
    g.held("idle")  # held, with no task: listed after the active ones
    page = client.groups(Q)
    assert page.next_cursor is None
    assert [x.group for x in page.items] == ["acme", "beta", "", "idle"]
    got = by_name(page.items)
    acme = got["acme"]
    assert (acme.waiting, acme.running, acme.paused) == (6, 2, False)
    assert acme.oldest_waiting_s is not None and 100 <= acme.oldest_waiting_s < 160
    assert got["beta"] == GroupInfo("beta", 0, 1, True, None)
    assert got[""].waiting == 1 and got[""].oldest_waiting_s is not None
    assert 5 <= got[""].oldest_waiting_s < 65
    assert got["idle"] == GroupInfo("idle", 0, 0, True, None)


def test_a_queue_without_groups_lists_none(keys: Keys, client: Client) -> None:
    page = client.groups(Q)
    assert page.items == [] and page.next_cursor is None


def test_bad_arguments_are_refused(client: Client) -> None:
    for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "x1.2"}, {"cursor": "i1"}):
        with pytest.raises(InvalidRequest):
            client.groups(Q, **bad)
    with pytest.raises(InvalidRequest, match="queue"):
        client.groups("no such/queue")
    for group in ("", "x" * 257):
        with pytest.raises(InvalidRequest, match="group"):
            client.pause_group(Q, group)


# --- hold and release ---------------------------------------------------------------------


def test_pause_and_resume_a_group_through_the_sdk(
    r: redis.Redis, keys: Keys, client: Client, settings: Settings
) -> None:
    qk = keys.queue(Q)
    assert client.pause_group(Q, "acme") is True
    assert r.sismember(qk.group_paused, "acme")
    assert client.pause_group(Q, "acme") is False  # already held
    assert [x.group for x in client.groups(Q).items] == ["acme"]  # held, idle: listed

    async def async_side() -> tuple[bool, bool, list[str]]:
        async with AsyncClient(settings=settings) as ac:
            first = await ac.resume_group(Q, "acme")
            again = await ac.resume_group(Q, "acme")
            return first, again, [x.group for x in (await ac.groups(Q)).items]

    assert asyncio.run(async_side()) == (True, False, [])
    assert not r.exists(qk.group_paused)


# --- partitions ---------------------------------------------------------------------------


def parted(settings: Settings, n: int = 3) -> Settings:
    return settings.model_copy(update={"queue_partitions": {Q: n}})


@pytest.mark.cluster
def test_a_partitioned_queue_lists_each_group_once_with_its_partitions_summed(
    r: redis.Redis, settings: Settings, keys: Keys
) -> None:
    p0, p1, p2 = (Groups(r, keys.queue(q)) for q in (Q, f"{Q}~1", f"{Q}~2"))
    p0.waiting("acme", 5, 2, age_s=10)
    p2.waiting("acme", 5, 3, age_s=50)  # its oldest is here
    p2.running("acme", 1)
    p1.waiting("beta", 3, 1, age_s=1)
    p1.held("held")  # held in two partitions, idle: listed once
    p2.held("held")
    p2.held("beta")
    with Client(settings=parted(settings)) as c:
        page = c.groups(Q)
        assert page.next_cursor is None
        assert [x.group for x in page.items] == ["acme", "beta", "held"]
        got = by_name(page.items)
        assert (got["acme"].waiting, got["acme"].running, got["acme"].paused) == (5, 1, False)
        assert got["acme"].oldest_waiting_s is not None and got["acme"].oldest_waiting_s >= 50
        assert got["beta"].paused and got["beta"].waiting == 1
        assert got["held"] == GroupInfo("held", 0, 0, True, None)
        # One name per page: the walk visits every partition and still lists each once.
        seen, cursor = [], None
        for _ in range(20):
            one = c.groups(Q, cursor=cursor, limit=1)
            assert len(one.items) <= 1
            seen += [x.group for x in one.items]
            cursor = one.next_cursor
            if cursor is None:
                break
        assert seen == ["acme", "beta", "held"]
        # Hold and release reach every partition.
        assert c.pause_group(Q, "gamma") is True
        assert all(
            r.sismember(keys.queue(q).group_paused, "gamma") for q in (Q, f"{Q}~1", f"{Q}~2")
        )
        assert c.resume_group(Q, "held") is True
        assert not any(
            r.sismember(keys.queue(q).group_paused, "held") for q in (f"{Q}~1", f"{Q}~2")
        )


# --- the page's bound ---------------------------------------------------------------------


def test_pages_are_bounded_and_the_walk_lists_every_group_once(
    r: redis.Redis, keys: Keys, client: Client
) -> None:
    g = Groups(r, keys.queue(Q))
    names = [f"g{i:04d}" for i in range(300)]
    with r.pipeline(transaction=False) as pipe:
        for i, name in enumerate(names):
            pipe.zadd(g.qk.group_index, {name: i})
            pipe.rpush(g.qk.group_waiting(4, name), "x")
        for i in range(30):
            pipe.sadd(g.qk.group_paused, f"h{i:02d}")  # held idle ones after the active
        pipe.execute()
    r.config_resetstat()
    first = client.groups(Q, limit=10)
    stats = r.info("commandstats")
    assert [x.group for x in first.items] == names[:10] and first.examined == 10
    # Ten names looked up: ten bands' lists each, not the 300 groups' keys.
    assert stats["cmdstat_llen"]["calls"] == 10 * 10
    assert all(x.waiting == 1 for x in first.items)
    listed, cursor = [x.group for x in first.items], first.next_cursor
    while cursor is not None:
        page = client.groups(Q, cursor=cursor, limit=64)
        assert len(page.items) <= 64 and page.examined <= 64
        listed += [x.group for x in page.items]
        cursor = page.next_cursor
    assert listed[:300] == names
    assert sorted(listed[300:]) == [f"h{i:02d}" for i in range(30)]


def test_many_partitions_shrink_the_page_to_the_budget(
    r: redis.Redis, keys: Keys, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = Groups(r, keys.queue(Q))
    for i in range(12):
        g.waiting(f"g{i:02d}", 1, 1, age_s=1)
    monkeypatch.setattr(go, "GROUP_BUDGET", 20)  # 4 partitions: 5 names a page
    with Client(settings=parted(settings, 4)) as c:
        page = c.groups(Q, limit=100)
        assert page.examined == 5 and len(page.items) == 5 and page.next_cursor
        rest = c.groups(Q, cursor=page.next_cursor, limit=100)
        assert [x.group for x in rest.items] == [f"g{i:02d}" for i in range(5, 10)]


# --- admin, API, CLI, metrics -------------------------------------------------------------


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


async def test_the_api_lists_pauses_and_resumes_groups(
    r: redis.Redis, keys: Keys, http: httpx.AsyncClient
) -> None:
    g = Groups(r, keys.queue(Q))
    g.waiting("acme", 5, 3, age_s=20)
    g.running("beta", 2)
    res = await http.get(f"/api/v1/queues/{Q}/groups")
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["next_cursor"] is None
    assert [(x["group"], x["waiting"], x["running"], x["paused"]) for x in body["items"]] == [
        ("acme", 3, 0, False),
        ("beta", 0, 2, False),
    ]
    assert body["items"][0]["oldest_waiting_s"] >= 20
    page = (await http.get(f"/api/v1/queues/{Q}/groups?limit=1")).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = (await http.get(f"/api/v1/queues/{Q}/groups?cursor={page['next_cursor']}")).json()
    assert [x["group"] for x in rest["items"]] == ["beta"]

    res = await http.post(f"/api/v1/queues/{Q}/groups/acme/pause")
    assert res.status_code == 200, res.text
    assert res.json() == {"queue": Q, "group": "acme", "paused": True, "changed": True}
    again = (await http.post(f"/api/v1/queues/{Q}/groups/acme/pause")).json()
    assert again["changed"] is False
    listed = (await http.get(f"/api/v1/queues/{Q}/groups")).json()["items"]
    assert {x["group"]: x["paused"] for x in listed} == {"acme": True, "beta": False}
    res = await http.post(f"/api/v1/queues/{Q}/groups/acme/resume")
    assert res.json() == {"queue": Q, "group": "acme", "paused": False, "changed": True}
    assert not r.sismember(keys.queue(Q).group_paused, "acme")
    # A group name is one path segment: spaces and colons come percent-encoded.
    res = await http.post(f"/api/v1/queues/{Q}/groups/{quote('acme corp:eu', safe='')}/pause")
    assert res.json()["group"] == "acme corp:eu"
    assert r.sismember(keys.queue(Q).group_paused, "acme corp:eu")


async def test_the_api_answers_404_for_an_unknown_queue_and_422_for_bad_input(
    keys: Keys, http: httpx.AsyncClient
) -> None:
    for path in ("/api/v1/queues/nope/groups", "/api/v1/queues/nope/groups/acme/pause"):
        res = await (http.get(path) if path.endswith("groups") else http.post(path))
        assert res.status_code == 404 and res.json()["error"]["code"] == "not_found"
    for query in ("cursor=zz", "limit=0", "limit=5000"):
        res = await http.get(f"/api/v1/queues/{Q}/groups?{query}")
        assert res.status_code == 422, query
    long = "x" * 257
    assert (await http.post(f"/api/v1/queues/{Q}/groups/{long}/pause")).status_code == 422


async def test_the_exporter_gauges_active_groups_per_queue(
    r: redis.Redis, keys: Keys, settings: Settings
) -> None:
    s = parted(settings, 2)
    p0, p1 = Groups(r, keys.queue(Q)), Groups(r, keys.queue(f"{Q}~1"))
    p0.waiting("a", 1, 1, age_s=1)
    p0.running("b", 1)
    p1.waiting("c", 1, 1, age_s=1)
    async with Admin(s) as admin:
        assert (await admin.get_queue(Q)).active_groups == 3
        text = (await render(admin)).decode()
    assert f'dtq_queue_active_groups{{queue="{Q}"}} 3.0' in text
    assert "group=" not in text  # never a label


@pytest.fixture
def dtq(settings: Settings, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from dtq.cli import main

    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)

    def run(*argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(argv))
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    return run


def test_the_cli_lists_pauses_and_resumes_groups(r: redis.Redis, keys: Keys, dtq: Any) -> None:
    g = Groups(r, keys.queue(Q))
    g.waiting("acme", 5, 3, age_s=20)
    g.waiting("", 5, 1, age_s=1)
    code, out, _ = dtq("groups", Q)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["GROUP", "WAITING", "RUNNING", "PAUSED", "OLDEST"]
    assert lines[1].split()[:4] == ["acme", "3", "0", "no"]
    assert lines[2].split()[:4] == ["(ungrouped)", "1", "0", "no"]

    code, out, _ = dtq("pause", Q, "--group", "acme")
    assert code == 0 and "group 'acme' paused" in out
    code, out, _ = dtq("pause", Q, "--group", "acme", "--json")
    assert json.loads(out) == {"queue": Q, "group": "acme", "paused": True, "changed": False}
    code, out, _ = dtq("groups", Q, "--json")
    data = json.loads(out)
    assert data["next_cursor"] is None
    assert [(x["group"], x["paused"]) for x in data["items"]] == [("acme", True), ("", False)]
    code, out, _ = dtq("resume", Q, "--group", "acme")
    assert code == 0 and "group 'acme' resumed" in out
    code, out, _ = dtq("resume", Q, "-g", "acme")
    assert code == 0 and "was not paused" in out
    assert not r.exists(keys.queue(Q).group_paused)
    # Pages: --limit, and the cursor to go on from.
    code, out, _ = dtq("groups", Q, "--limit", "1")
    assert "more: --cursor i0.1" in out
    code, out, _ = dtq("groups", Q, "--cursor", "i0.1", "--json")
    assert [x["group"] for x in json.loads(out)["items"]] == [""]
    # The documented exit codes: an unknown queue 1, a bad option 2.
    code, _, err = dtq("groups", "nope")
    assert code == 1 and "no queue named 'nope'" in err
    assert dtq("pause", "nope", "--group", "acme")[0] == 1
    assert dtq("groups", Q, "--cursor", "zz")[0] == 2
    assert dtq("pause", Q, "--group", "")[0] == 2


# --- the dashboard ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_dashboard_shows_a_queues_groups_and_pauses_one(
    r: redis.Redis, keys: Keys, settings: Settings, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    g = Groups(r, keys.queue(Q))
    g.waiting("acme", 5, 3, age_s=20)
    g.running("beta", 2)
    g.waiting("", 5, 1, age_s=1)
    api = ApiProc(settings, DTQ_API_TOKEN=dash.TOKEN)
    page = browser_page
    try:
        page.goto(api.url + "/#queues")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", dash.TOKEN)
        page.click("#token-ok")
        link = page.locator(f"tr[data-queue={Q}] [data-testid=groups-link]")
        expect(link).to_have_text("3")
        link.click()
        table = page.locator("[data-testid=groups-table]")
        expect(table.locator("tr[data-group]")).to_have_count(3)
        acme = table.locator("tr[data-group=acme]")
        expect(acme.locator("td:nth-child(3)")).to_have_text("3")
        expect(table.locator("tr[data-group=beta] td:nth-child(4)")).to_have_text("2")
        expect(table.locator("tr[data-group=''] button")).to_have_count(0)  # ungrouped: no hold
        acme.locator("button[data-act=pause-group]").click()
        expect(acme.locator(".badge.paused")).to_be_visible()
        assert r.sismember(keys.queue(Q).group_paused, "acme")
        dash.shot(page, "groups")
        acme.locator("button[data-act=resume-group]").click()
        expect(acme.locator("button[data-act=pause-group]")).to_be_visible()
        assert not r.sismember(keys.queue(Q).group_paused, "acme")
    except Exception:
        print(api.output()[-3000:])
        raise
    finally:
        api.close()
