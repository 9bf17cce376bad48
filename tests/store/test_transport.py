"""The transport (store/transport.py): the only module that touches redis-py's private parts, the
decision to use the fast lane, and the same results whichever path a call takes."""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dtq import AsyncClient, Client
from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store import transport
from dtq_worker.metrics import WorkerMetrics
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
# Names of redis-py's (and hiredis') private parts the lane uses: an attribute with one of these
# names, or an import from a private redis module, anywhere but store/transport.py fails the test.
PRIVATE_ATTRS = {"_sock", "_parser", "_buffer", "_reader", "_host_error", "_next_response"}


def _python_files() -> Iterator[Path]:
    for top in ("libs", "apps"):
        yield from (ROOT / top).rglob("*.py")


def _private_uses(path: Path) -> list[str]:
    """Where ``path`` touches a private part of redis-py (see PRIVATE_ATTRS)."""
    found = []
    where = path.relative_to(ROOT)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRS:
            # (a class's own attribute of that name is not redis-py's)
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{where}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("redis") and any(
                part.startswith("_") for part in node.module.split(".")
            ):
                found.append(f"{where}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("redis") and "._" in alias.name:
                    found.append(f"{where}:{node.lineno} import {alias.name}")
    return found


TRANSPORT = ROOT / "libs" / "dtq" / "store" / "transport.py"


def test_no_module_outside_the_transport_touches_redis_py_private_parts() -> None:
    assert [hit for p in _python_files() if p != TRANSPORT for hit in _private_uses(p)] == []


def test_the_scan_finds_what_it_looks_for() -> None:
    """The scan can fail: in the transport itself it finds every private part the lane uses."""
    hits = " ".join(_private_uses(TRANSPORT))
    for part in ("._sock", "._parser", "._buffer", "._host_error", "from redis._parsers"):
        assert part in hits


@pytest.fixture
def fresh_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget this process's decision (and what was logged) for the test's length."""
    monkeypatch.setattr(transport, "_missing", None)
    monkeypatch.setattr(transport, "_told", set())
    monkeypatch.setattr(transport, "_state", None)


def test_this_redis_py_has_what_the_lane_needs() -> None:
    # The lane runs on the redis-py this suite runs with (make test-oldest: the oldest one
    # pyproject.toml accepts); a release that lacks a part is named by missing().
    assert transport.missing() == []


@pytest.mark.usefixtures("fresh_decision")
def test_a_missing_part_turns_the_lane_off_said_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DTQ_FAST_LANE", "1")  # (make test-lanes-off sets 0)
    monkeypatch.setattr(transport, "missing", lambda: ["redis.connection.Connection._sock"])
    caplog.set_level(logging.INFO, "dtq.store.transport")
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    s = sc.SyncScripts(r)
    assert s.lane is None and transport.in_use() is False
    assert sc.SyncScripts(r, fast_lane=True).lane is None  # asking for it changes nothing
    said = [rec for rec in caplog.records if rec.name == "dtq.store.transport"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "Connection._sock" in said[0].getMessage() and redis.__version__ in said[0].getMessage()
    lane = transport.AsyncLane(aredis.Redis.from_url(redis_server.url))
    assert lane.fast is False
    r.close()


@pytest.mark.usefixtures("fresh_decision")
def test_dtq_fast_lane_0_turns_it_off(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DTQ_FAST_LANE", "0")
    caplog.set_level(logging.INFO, "dtq.store.transport")
    assert Settings().fast_lane is False and transport.setting_from_env() is False
    with Client(settings=settings.model_copy(update={"fast_lane": False})) as c:
        assert c._scripts.lane is None
        h = c.enqueue("noop")
        assert c.get(h.id).status.value == "queued"
        assert len(c.enqueue_many([{"name": "noop"}] * 300)) == 300
    assert transport.in_use() is False
    said = [rec.getMessage() for rec in caplog.records if rec.name == "dtq.store.transport"]
    assert len(said) == 1 and "DTQ_FAST_LANE=0" in said[0]
    monkeypatch.setenv("DTQ_FAST_LANE", "1")
    assert transport.setting_from_env() is True and transport.fast_lane() is True


@pytest.mark.usefixtures("fresh_decision")
async def test_async_client_without_the_lane(settings: Settings) -> None:
    off = settings.model_copy(update={"fast_lane": False})
    async with AsyncClient(settings=off) as c:
        assert c._scripts.lanes == []
        assert not any(cls.__name__.startswith("Hiredis") for cls in type(c.redis).__mro__)
        hs = await c.enqueue_many([{"name": "noop", "args": [i]} for i in range(300)])
        assert [(await c.get(h.id)).args for h in hs[::100]] == [[0], [100], [200]]
        assert c._scripts.lanes == []


@pytest.fixture(params=[True, False], ids=["lane", "usual"])
def fast(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


ECHO = "return ARGV[1]"
BOOM = "return redis.error_reply('BOOM ' .. ARGV[1])"


def _with_test_scripts(s: Any, r: Any) -> Any:
    s._objs["echo"] = r.register_script(ECHO)
    s._objs["boom"] = r.register_script(BOOM)
    return s


def test_sync_calls_answer_the_same_either_way(fresh_redis: RedisServer, fast: bool) -> None:
    if fast and not transport.fast_lane(None):
        pytest.skip("the fast lane is off here")
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    s = _with_test_scripts(sc.SyncScripts(r, fast_lane=fast), r)
    assert (s.lane is not None) is fast
    assert s.run(sc.Call("echo", [], ["a"])) == "a"
    with pytest.raises(redis.ResponseError, match="BOOM x"):
        s.run(sc.Call("boom", [], ["x"]))
    r.script_flush()  # NOSCRIPT: loaded and run once
    assert s.run_many(sc.Call("echo", [], [str(i)]) for i in range(3)) == ["0", "1", "2"]
    seen: list[tuple[int, Any]] = []
    calls = [sc.Call("echo", [], ["p"]), sc.Call("echo", [], ["q"])]
    assert s.run_many(calls, lambda k, v: seen.append((k, v))) == ["p", "q"]
    assert sorted(seen) == [(0, "p"), (1, "q")]
    with pytest.raises(redis.ResponseError, match="BOOM y"):
        s.run_many([sc.Call("echo", [], ["a"]), sc.Call("boom", [], ["y"])])
    fresh_redis.restart()  # a dead connection: reconnected, nothing lost
    try:
        assert s.run(sc.Call("echo", [], ["after"])) == "after"
    except redis.ConnectionError:  # redis-py < 8.1 does not retry a dead pooled connection
        assert s.run(sc.Call("echo", [], ["after"])) == "after"
    r.close()


async def test_async_calls_answer_the_same_either_way(fresh_redis: RedisServer, fast: bool) -> None:
    if fast and not transport.fast_lane(None):
        pytest.skip("the fast lane is off here")
    r = aredis.Redis.from_url(fresh_redis.url, decode_responses=True)
    s = _with_test_scripts(sc.AsyncScripts(r, fast_lane=fast), r)
    assert await s.run(sc.Call("echo", [], ["a"])) == "a"
    assert bool(s.lanes) is fast
    with pytest.raises(redis.ResponseError, match="BOOM x"):
        await s.run(sc.Call("boom", [], ["x"]))
    await r.script_flush()
    got = await s.run_many(sc.Call("echo", [], [str(i)]) for i in range(3))
    assert got == ["0", "1", "2"]
    fresh_redis.restart()
    await asyncio.sleep(0.05)
    try:
        assert await s.run(sc.Call("echo", [], ["after"])) == "after"
    except redis.ConnectionError:  # a second pooled connection died too (no client retries)
        assert await s.run(sc.Call("echo", [], ["after"])) == "after"
    await r.aclose()


async def test_a_lane_pair_either_way(redis_server: RedisServer, prefix: str, fast: bool) -> None:
    """The worker's idle wait: a blocking XREAD and a second command in one write, both
    replies read; an error reply is returned, not raised, and the lane stays in step."""
    if fast and not transport.fast_lane(None):
        pytest.skip("the fast lane is off here")
    r = aredis.Redis.from_url(redis_server.url, decode_responses=True)
    lane = transport.AsyncLane(r, fast=fast)
    assert lane.fast is fast
    stream = f"{prefix}:s"
    await r.xadd(stream, {"f": "v"})
    one, two = await lane.call_pair(("XREAD", "BLOCK", 100, "STREAMS", stream, "0"), ("PING",), 5)
    assert "v" in repr(one) and two in ("PONG", True)  # (a list, or a map under RESP3)
    one, two = await lane.call_pair(("PING",), ("NOSUCHCOMMAND",), 5)
    assert isinstance(two, redis.ResponseError)
    assert await lane.call(("ECHO", "next")) == "next"
    ident = await lane.call(("CLIENT", "ID"))
    assert await lane.call(("CLIENT", "ID")) == ident  # one kept connection (CLIENT UNBLOCK)
    with pytest.raises(TimeoutError):
        await lane.call_pair(
            ("XREAD", "BLOCK", 2000, "STREAMS", f"{prefix}:none", "$"), ("PING",), 0.1
        )
    assert not lane.connected  # a hung pair drops its connection
    assert await lane.call(("ECHO", "again")) == "again"
    await lane.drop()
    await r.aclose()


def test_the_worker_gauge_says_whether_the_lane_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read with prometheus_client's own exposition parser."""

    def value(m: WorkerMetrics) -> float:
        text = generate_latest(m.registry).decode()
        for fam in text_string_to_metric_families(text):
            if fam.name == "dtq_fast_lane_enabled":
                return float(fam.samples[0].value)
        raise AssertionError("no dtq_fast_lane_enabled")

    m = WorkerMetrics("w-gauge")
    monkeypatch.setattr(transport, "_state", True)
    assert value(m) == 1.0
    monkeypatch.setattr(transport, "_state", False)
    assert value(m) == 0.0
