"""Bad input at the SDK and CLI edges: names, times, bulk batches, URLs and ids.

Each test feeds the input a careless or hostile caller would, against a real redis-server, and
checks that dtq refuses it with a :class:`dtq.DtqError` (one line, exit 2 in the CLI) before
anything is written, or that a reader shows a bad stored value instead of crashing.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, ConfigError, DtqError, InvalidRequest, Settings
from dtq.admin import Admin, filled_page
from dtq.cli import main
from dtq.errors import BadTaskId
from dtq.jsonlog import JsonFormatter
from dtq.logs import TextFormatter
from dtq.settings import load_settings
from dtq.store.keys import QueueKeys


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: Any, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    return settings


# --- names: full matches only, no control characters -----------------------------------------


BAD_QUEUES = ["default\n", "default\r", "a\x00", "\ndefault", "de fault", ""]


@pytest.mark.parametrize("queue", BAD_QUEUES[:-1])
def test_enqueue_refuses_a_queue_name_with_a_trailing_newline_or_control(
    settings: Settings, r: redis.Redis, queue: str
) -> None:
    with Client(settings=settings) as c:
        with pytest.raises(InvalidRequest, match="bad queue name"):
            c.enqueue("add", [1, 2], queue=queue)
        with pytest.raises(InvalidRequest, match="bad queue name"):
            c.enqueue_many([{"name": "add", "queue": queue}])
    assert r.keys(f"{settings.key_prefix}:*") == []


@pytest.mark.parametrize("name", ["add\n", "a\nINFO dtq.worker: forged", "a\x1b[31m", "a\x7f"])
def test_enqueue_refuses_control_characters_in_task_names(
    settings: Settings, r: redis.Redis, name: str
) -> None:
    with Client(settings=settings) as c, pytest.raises(InvalidRequest, match="task name"):
        c.enqueue(name)
    assert r.keys(f"{settings.key_prefix}:*") == []


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"DTQ_QUEUES": ("default\n",)}, "DTQ_QUEUES"),  # (a comma list is trimmed: a tuple)
        ({"DTQ_WORKER_ID": "w1\n"}, "DTQ_WORKER_ID"),
        ({"DTQ_KEY_PREFIX": "dtq\r"}, "DTQ_KEY_PREFIX"),
        ({"DTQ_KEY_PREFIX": "dtq\x00"}, "DTQ_KEY_PREFIX"),
        ({"DTQ_QUEUE_CONCURRENCY": "bulk\x1b=2"}, "DTQ_QUEUE_CONCURRENCY"),
        ({"DTQ_GROUP_CONCURRENCY": "bulk\x1b=2"}, "DTQ_GROUP_CONCURRENCY"),
        ({"DTQ_QUEUE_PARTITIONS": "bulk\x1b=2"}, "DTQ_QUEUE_PARTITIONS"),
    ],
)
def test_settings_refuse_names_with_a_trailing_newline(env: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        load_settings(**{k.removeprefix("DTQ_").lower(): v for k, v in env.items()})


async def test_admin_refuses_a_queue_name_with_a_trailing_newline(settings: Settings) -> None:
    async with Admin(settings) as a:
        for call in (a.pause, a.resume, a.get_queue):
            with pytest.raises(InvalidRequest):
                await call("default\n")


def test_schedule_refuses_a_queue_name_with_a_trailing_newline() -> None:
    from dtq.schedules import Schedule

    with pytest.raises(InvalidRequest):
        Schedule(name="s", task="add", queue="default\n", every=60)
    with pytest.raises(InvalidRequest):
        Schedule(name="s\n", task="add", every=60)


def test_task_ids_with_a_bad_queue_part_are_refused(settings: Settings) -> None:
    with Client(settings=settings) as c:
        for bad in ("default\n:abc", "de fault:abc", "default:ab\nc"):
            with pytest.raises(BadTaskId):
                c.get(bad)


def _record(name: str, msg: str, *args: Any, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_text_log_lines_cannot_be_forged_by_a_name_with_a_newline() -> None:
    forged = "x\n2026-01-01 00:00:00 ERROR   dtq.worker: forged line"
    line = TextFormatter().format(_record("dtq.worker", "started %s %s", forged, "q:1"))
    assert "\n" not in line and "\r" not in line
    assert "forged line" in line  # shown, escaped, not dropped
    # Control characters other than newlines (a terminal escape) are neutralised too.
    assert "\x1b" not in TextFormatter().format(_record("dtq.worker", "%s", "a\x1b[2Jb"))


def test_json_log_fields_cannot_carry_raw_control_characters() -> None:
    out = JsonFormatter().format(_record("dtq.worker", "%s", "a\nb", task="t\x1b"))
    assert "\n" not in out and "\x1b" not in out
    assert json.loads(out)["msg"] == "a\nb"  # JSON escapes keep the text exact


def test_cli_tables_strip_control_characters(
    cli_env: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # A record written by an older, laxer version (or by hand) with a name holding a newline
    # and a terminal escape: the listing shows it on one line, escapes neutralised.
    qk = QueueKeys(cli_env.key_prefix, "default")
    r.sadd(f"{cli_env.key_prefix}:queues", "default")
    r.hset(qk.task("abc"), mapping={
        "name": "evil\nFORGED ROW\x1b[2J", "args": "[]", "prio": "5", "maxr": "0",
        "attempt": "0", "retries": "0", "intr": "0", "enq": "1", "status": "failed",
        "finished": "2", "error": "boom\nFORGED",
    })  # fmt: skip
    r.zadd(qk.dlq, {"abc": 2})
    for argv in (("tasks", "--queue", "default"), ("dlq", "list")):
        code, out, err = run_cli(monkeypatch, capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out
        lines = out.splitlines()
        assert not any(line.startswith("FORGED") for line in lines), out
    code, out, err = run_cli(monkeypatch, capsys, "task", "default:abc")
    assert code == 0, err
    assert "\x1b" not in out and not any(x.startswith("FORGED") for x in out.splitlines())


# --- item 16: URLs, ids, prefixes --------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6390/0?socket_timeout=abc",
        "redis://127.0.0.1:6390/0?no_such_option=1",
        "unix:///tmp/redis.sock?db=zero",
    ],
)
def test_a_malformed_redis_url_option_is_one_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="DTQ_REDIS_URL"):
        load_settings(redis_url=url)
    with pytest.raises(DtqError):
        Client(url)


def test_cli_with_a_malformed_redis_url_option_prints_one_line(
    cli_env: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    code, _out, err = run_cli(
        monkeypatch, capsys, "--redis-url", "redis://127.0.0.1:1/0?socket_timeout=abc", "queues"
    )
    assert code == 2
    assert err.strip().count("\n") == 0 and "DTQ_REDIS_URL" in err and "Traceback" not in err


@pytest.mark.parametrize("bad", [None, 42, b"default:abc", ""])
def test_get_with_a_non_string_id_raises_bad_task_id(settings: Settings, bad: Any) -> None:
    with Client(settings=settings) as c:
        with pytest.raises(BadTaskId):
            c.get(bad)
        with pytest.raises(BadTaskId):
            c.cancel(bad)


async def test_async_get_with_a_non_string_id_raises_bad_task_id(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        with pytest.raises(BadTaskId):
            await c.get(None)  # type: ignore[arg-type]


def test_cli_refuses_an_empty_prefix(
    cli_env: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "--prefix", "", "queues")
    assert code == 2, (out, err)
    assert "DTQ_KEY_PREFIX" in err and err.strip().count("\n") == 0
    monkeypatch.setenv("DTQ_KEY_PREFIX", "")
    code, out, err = run_cli(monkeypatch, capsys, "queues")
    assert code == 2 and "DTQ_KEY_PREFIX" in err


# --- bad times: bounded at enqueue, tolerated when read ----------------------------------------


FAR = [
    {"eta": datetime(9999, 12, 31, tzinfo=UTC)},
    {"eta": "9999-12-31T23:59:59+00:00"},
    {"delay": 1e300},
    {"delay": timedelta(days=999_999_999)},
    {"expires": 1e300},
    {"timeout": 1e300},
]


@pytest.mark.parametrize("when", FAR, ids=lambda w: next(iter(w)))
def test_enqueue_refuses_times_beyond_the_bound(
    settings: Settings, r: redis.Redis, when: dict[str, Any]
) -> None:
    with Client(settings=settings) as c:
        with pytest.raises(InvalidRequest, match="at most"):
            c.enqueue("add", [1, 2], **when)
        with pytest.raises(InvalidRequest, match="at most"):
            c.enqueue_many([{"name": "add", **when}])
    assert r.keys(f"{settings.key_prefix}:*") == []


def test_schedule_refuses_a_period_beyond_the_bound() -> None:
    from dtq.schedules import Schedule

    with pytest.raises(InvalidRequest, match="at most"):
        Schedule(name="s", task="add", every=1e300)


def test_enqueue_accepts_a_time_within_the_bound(settings: Settings) -> None:
    with Client(settings=settings) as c:
        h = c.enqueue("add", eta=datetime.now(UTC) + timedelta(days=3 * 365))
        assert c.get(h.id).due_at is not None


def _bad_times(r: redis.Redis, settings: Settings) -> str:
    """A scheduled task and a schedule whose stored times no datetime can hold (written by an
    older version that accepted year 9999, or by hand); returns the task's id."""
    with Client(settings=settings) as c:
        h = c.enqueue("add", [1, 2], delay=60)
        from dtq.schedules import Schedule, add_schedule

        add_schedule(c, Schedule(name="nightly", task="add", every=3600))
    qk = QueueKeys(settings.key_prefix, "default")
    tid = h.id.split(":")[1]
    r.hset(qk.task(tid), mapping={"due": "1e+303", "enq": "inf", "started": "x", "exp": "9" * 30})
    r.zadd(qk.sched, {tid: 1e303})
    r.zadd(qk.schedules_next, {"nightly": 1e303})
    return h.id


async def test_readers_tolerate_bad_stored_times(settings: Settings, r: redis.Redis) -> None:
    task_id = _bad_times(r, settings)
    with Client(settings=settings) as c:
        info = c.get(task_id)
        assert info.due_at is None and info.enqueued_at is None and info.expires_at is None
        assert info.started_at is None and info.status.value == "scheduled"
        json.dumps(info.to_dict())
    async with Admin(settings) as a:
        assert (await a.get_task(task_id))["id"] == task_id
        scheduled = await a.list_scheduled()
        assert [s.task_id for s in scheduled] == [task_id] and scheduled[0].due_at is None
        (sched,) = await a.list_schedules()
        assert sched["name"] == "nightly"
        # A page's SCANs are bounded (SCAN_BUDGET): on a session server crowded by other
        # tests' keys the first page can be empty with a cursor, so the cursor is followed.
        page = await filled_page(
            lambda cur, n: a.list_tasks(queue="default", cursor=cur, limit=n), None, 50
        )
        assert [t["id"] for t in page.items] == [task_id]


def test_cli_tolerates_bad_stored_times(
    cli_env: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    task_id = _bad_times(r, cli_env)
    for argv in (("task", task_id), ("schedules",), ("tasks",), ("task", task_id, "--json")):
        code, out, err = run_cli(monkeypatch, capsys, *argv)
        assert code == 0, (argv, err)
        assert task_id in out


# --- bulk enqueue: all or nothing, only DtqErrors ----------------------------------------------


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


BAD_ITEMS = {
    "surrogate in args": {"name": "add", "args": ["\ud800"]},
    "surrogate in kwargs": {"name": "add", "kwargs": {"k": "a\udfffb"}},
    "surrogate in a kwargs key": {"name": "add", "kwargs": {"\ud800": 1}},
    "surrogate in metadata": {"name": "add", "metadata": {"m": "\ud800"}},
    "surrogate in the idempotency key": {"name": "add", "idempotency_key": "k\ud800"},
    "surrogate in the name": {"name": "add\ud800"},
    "nesting too deep to encode": {"name": "add", "args": [_deep(100_000)]},
    "not a mapping": 42,
    "None": None,
}


@pytest.mark.parametrize("bad", list(BAD_ITEMS.values()), ids=list(BAD_ITEMS))
def test_enqueue_many_is_all_or_nothing_and_raises_only_dtq_errors(
    settings: Settings, r: redis.Redis, bad: Any
) -> None:
    items: list[Any] = [{"name": "add", "args": [i, i], "queue": f"q{i % 3}"} for i in range(600)]
    items[550] = bad
    with Client(settings=settings) as c:
        with pytest.raises(DtqError):
            c.enqueue_many(items)
        assert r.keys(f"{settings.key_prefix}:*") == []  # nothing sent, nothing registered
        assert len(c.enqueue_many(items[:550])) == 550  # the client still works


async def test_async_enqueue_many_is_all_or_nothing(settings: Settings, r: redis.Redis) -> None:
    items: list[Any] = [{"name": "add", "args": [i, i]} for i in range(600)]
    items[550] = {"name": "add", "args": ["\ud800"]}
    async with AsyncClient(settings=settings) as c:
        with pytest.raises(DtqError):
            await c.enqueue_many(items)
        with pytest.raises(DtqError):
            await c.enqueue("add", ["\ud800"])
    assert r.keys(f"{settings.key_prefix}:*") == []


# --- the same inputs over HTTP (the API builds tasks and reads them through the SDK) ----------


@pytest.fixture
async def http(settings: Settings) -> Any:
    import httpx

    from dtq_api.app import create_app

    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


@pytest.mark.parametrize(
    "body",
    [
        {"name": "add", "queue": "default\n"},
        {"name": "add\nforged"},
        {"name": "add", "eta": "9999-12-31T00:00:00+00:00"},
        {"name": "add", "delay": 1e300},
    ],
    ids=["queue with a newline", "name with a newline", "eta in 9999", "delay 1e300"],
)
async def test_api_refuses_bad_names_and_times_with_422(
    http: Any, settings: Settings, r: redis.Redis, body: dict[str, Any]
) -> None:
    resp = await http.post("/api/v1/tasks", json=body)
    assert resp.status_code == 422, resp.text
    assert r.keys(f"{settings.key_prefix}:*") == []


async def test_api_refuses_a_lone_surrogate_without_a_5xx(
    http: Any, settings: Settings, r: redis.Redis
) -> None:
    raw = '{"name": "add", "args": ["\\ud800"]}'  # valid JSON, not encodable text
    resp = await http.post(
        "/api/v1/tasks", content=raw, headers={"content-type": "application/json"}
    )
    assert 400 <= resp.status_code < 500, resp.text
    assert r.keys(f"{settings.key_prefix}:*") == []


async def test_api_reads_tolerate_bad_stored_times(
    http: Any, settings: Settings, r: redis.Redis
) -> None:
    task_id = _bad_times(r, settings)
    for path in (f"/api/v1/tasks/{task_id}", "/api/v1/schedules", "/api/v1/tasks"):
        resp = await http.get(path)
        assert resp.status_code == 200, (path, resp.text)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_redis_out_of_memory_is_a_dtq_error(
    fresh_redis: Any, prefix: str, mode: str
) -> None:
    from tests.conftest import make_settings

    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    items = [{"name": "add", "args": [i]} for i in range(600)]
    try:
        r.config_set("maxmemory", 1)  # every write is refused: "OOM command not allowed"
        if mode == "sync":
            with Client(settings=s) as c:
                for call in (lambda: c.enqueue("add"), lambda: c.enqueue_many(items)):
                    with pytest.raises(DtqError, match="maxmemory"):
                        call()
        else:
            async with AsyncClient(settings=s) as ac:
                with pytest.raises(DtqError, match="maxmemory"):
                    await ac.enqueue_many(items)
        r.config_set("maxmemory", 0)
        assert r.keys(f"{prefix}:*") == []
    finally:
        r.config_set("maxmemory", 0)
        r.close()


def test_cli_under_a_redis_refusing_writes_prints_one_line(
    fresh_redis: Any, prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("DTQ_REDIS_URL", fresh_redis.url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", prefix)
    r = fresh_redis.client()
    try:
        r.sadd(f"{prefix}:queues", "default")
        r.config_set("maxmemory", 1)
        for argv in (("pause", "default"), ("enqueue", "add"), ("purge", "default", "--yes")):
            code, _out, err = run_cli(monkeypatch, capsys, *argv)
            assert code == 3, (argv, err)
            last = err.strip().splitlines()[-1]  # (purge prints a progress label first)
            assert last.startswith("error:") and "maxmemory" in last and "Traceback" not in err
    finally:
        r.config_set("maxmemory", 0)
        r.close()


# --- nesting depth: refused at enqueue, tolerated when already stored -------------------------


def nested(depth: int) -> Any:
    """A JSON value ``depth`` levels deep (lists and objects alternating)."""
    v: Any = 1
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def test_enqueue_refuses_arguments_and_metadata_nested_too_deep(
    settings: Settings, r: redis.Redis, cli_env: Settings, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    from dtq.codec import MAX_DEPTH

    with Client(settings=settings) as c:
        c.enqueue("add", [nested(MAX_DEPTH - 1)])  # the args list is a level: 64 in all
        c.enqueue("add", kwargs={"a": nested(MAX_DEPTH - 1)})
        for kw in (
            {"args": [nested(260)]},
            {"args": [nested(MAX_DEPTH)]},
            {"kwargs": {"a": nested(MAX_DEPTH)}},
            {"metadata": {"m": nested(300)}},
        ):
            with pytest.raises(DtqError, match=f"nested deeper than {MAX_DEPTH}") as exc:
                c.enqueue("add", **kw)
            assert isinstance(exc.value, ValueError)
        with pytest.raises(DtqError, match="nested deeper"):
            c.enqueue_many([{"name": "add", "args": [nested(5000)]}])
    assert len(r.keys(f"{settings.key_prefix}:*:t:*")) == 2
    code, out, err = run_cli(
        monkeypatch, capsys, "enqueue", "add", "--args", json.dumps([nested(300)])
    )
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    assert "nested deeper" in err


def test_api_refuses_deep_arguments_and_readers_survive_stored_ones(
    settings: Settings, r: redis.Redis, cli_env: Settings, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    import asyncio

    ids = asyncio.run(_deep_records_through_the_api(settings, r))
    for tid in ids:
        code, out, err = run_cli(monkeypatch, capsys, "task", tid, "--json")
        assert code == 0 and "undecodable" in out, (code, err)
    code, out, err = run_cli(monkeypatch, capsys, "tasks", "--json")
    assert code == 0 and all(tid in out for tid in ids), (code, err)


async def _deep_records_through_the_api(settings: Settings, r: redis.Redis) -> list[str]:
    import httpx

    from dtq_api.app import create_app

    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        body = {"name": "add", "args": [nested(260)]}
        p = await http.post("/api/v1/tasks", json=body)
        assert p.status_code == 422, p.text
        assert "nested deeper" in p.json()["error"]["message"] and "\n" not in p.text
        assert (await http.get("/api/v1/tasks")).json()["items"] == []
        # Records written by a raw script, past any decoder's limit or not: every reader
        # answers, the value shown as undecodable.
        ok = (await http.post("/api/v1/tasks", json={"name": "add", "args": [1]})).json()["id"]
        qk = QueueKeys(settings.key_prefix, "default")
        ids = []
        async with AsyncClient(settings=settings) as c:
            for depth in (260, 5000):
                h = await c.enqueue("add", [1], metadata={"m": 1})
                raw = "[" * depth + "]" * depth
                meta = '{"m":' + raw + "}"
                r.hset(qk.task(h.id.split(":", 1)[1]), mapping={"args": raw, "meta": meta})
                ids.append(h.id)
        listing = await http.get("/api/v1/tasks")
        assert listing.status_code == 200, listing.text[:300]
        got = {t["id"]: t for t in listing.json()["items"]}
        assert set(got) == {ok, *ids}
        assert got[ok]["args"] == [1]
        for tid in ids:
            assert got[tid]["args"] == [{"undecodable": "nested deeper than 64 levels"}]
            one = await http.get(f"/api/v1/tasks/{tid}")
            assert one.status_code == 200 and one.json()["metadata"] == got[tid]["metadata"]
            assert "undecodable" in one.json()["metadata"], one.json()["metadata"]
    return ids


@pytest.mark.parametrize(
    "kw",
    [
        {"priority": 5.5},
        {"priority": "5"},
        {"priority": 10},
        {"max_retries": -1},
        {"timeout": "soon"},
        {"timeout": 0},
        {"expires": "soon"},
    ],
    ids=str,
)
def test_a_task_declaration_refuses_bad_defaults_with_one_dtq_error(kw: dict[str, Any]) -> None:
    """Refused where the task is declared, with InvalidRequest: not accepted there to fail at
    each enqueue, nor raised as a TypeError."""
    from dtq import App

    with pytest.raises(InvalidRequest):
        App().task(name="t", **kw)(lambda: None)
