"""History (dtq.stats): per-minute counts per queue, written by the scripts that enqueue and end
runs, read by ``GET /api/v1/stats``, ``dtq stats`` and the dashboard. Bodies marked ``cluster``
run against one redis-server and the test cluster."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dtq import AsyncClient, Client
from dtq import stats as st
from dtq.admin import Admin
from dtq.cli import main
from dtq.scripts import enqueue as enqueue_script
from dtq.store.keys import QueueKeys
from tests.api_proc import ApiProc
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker

Q = "hist"


def totals(buckets: list[dict[str, Any]]) -> dict[str, int]:
    return {c: sum(b[c] for b in buckets) for c in (*st.COUNTERS, "runs")}


def test_percentiles_come_from_the_bucket_counts() -> None:
    # 90 runs in the bucket up to 10 ms, 9 up to 1 s, 1 above the last bound
    hist = [0] * st.NBUCKETS
    hist[st.bucket_of(0.007)] = 90
    hist[st.bucket_of(0.7)] = 9
    hist[st.bucket_of(10_000.0)] = 1
    assert st.percentile(hist, 0.50) == 0.01
    assert st.percentile(hist, 0.95) == 1.0
    assert st.percentile(hist, 0.99) == 1.0
    assert st.percentile(hist, 1.0) == st.BOUNDS[-1]  # the open bucket answers its lower bound
    assert st.percentile([0] * st.NBUCKETS, 0.5) is None
    assert [st.bucket_of(b) for b in st.BOUNDS] == list(range(len(st.BOUNDS)))
    assert st.bucket_of(0.0) == 0 and st.bucket_of(1e9) == st.NBUCKETS - 1


def test_counts_survive_restarts_of_the_worker_and_the_api(
    redis_server: Any, prefix: str, spawn_worker: Any, capsys: Any, monkeypatch: Any
) -> None:
    s = make_settings(redis_server.url, prefix, queues=(Q,))
    with Client(settings=s) as c:
        ok = [c.enqueue("add", [i, 1], queue=Q) for i in range(5)]
        bad = [c.enqueue("fail_now", queue=Q) for _ in range(2)]
        flaky = c.enqueue("flaky", [1], queue=Q)  # fails once (retried), then succeeds
        w = spawn_worker("tests.apps.basic:app", s, "--queues", Q)
        for h in [*ok, flaky]:
            c.result(h.id, timeout=30)
        for h in bad:
            with pytest.raises(Exception, match="permanent problem"):
                c.result(h.id, timeout=30)
        w.kill()
    want = {"enqueued": 8, "succeeded": 6, "failed": 2, "retried": 1, "cancelled": 0, "runs": 9}
    for _ in range(2):  # a second API process, after the first is gone, answers the same
        api = ApiProc(s)
        try:
            body = httpx.get(f"{api.url}/api/v1/stats", params={"queue": Q, "minutes": 10}).json()
        finally:
            api.close()
        assert len(body) == 10
        assert totals(body) == want
        assert body[-1]["minute"].endswith("Z")
        busy = [b for b in body if b["runs"]]
        assert busy and all(b["p50"] is not None and b["p99"] >= b["p50"] for b in busy)
    monkeypatch.setenv("DTQ_REDIS_URL", s.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", s.key_prefix)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["stats", "--queue", Q, "--minutes", "10", "--json"])
    assert exc.value.code in (0, None)
    assert totals(json.loads(capsys.readouterr().out)) == want
    with pytest.raises(SystemExit):
        main(["stats", "--queue", Q, "--minutes", "10"])
    table = capsys.readouterr().out
    assert "succeeded" in table.lower() and "p95" in table.lower()


def test_each_key_expires_after_the_retention(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(redis_server.url, prefix, queues=(Q,), stats_retention_h=2)
    r = redis_server.client()
    qk = QueueKeys(prefix, Q)
    with Client(settings=s) as c:
        t0 = int(time.time()) // 60
        h = c.enqueue("add", [1, 2], queue=Q)
        c.enqueue_many([{"name": "add", "args": [i, 2], "queue": Q} for i in range(3)])
        t1 = int(time.time()) // 60
        # the enqueues' counters: one key per minute (the client's), each kept 2 hours after it
        minutes = [int(k.rsplit(":", 1)[1]) for k in r.keys(f"{qk.hist_enq_base}*")]
        assert minutes and all(t0 <= m <= t1 for m in minutes)
        assert sum(int(r.get(f"{qk.hist_enq_base}{m}")) for m in minutes) == 4
        assert all(2 * 3600 < r.ttl(f"{qk.hist_enq_base}{m}") <= 2 * 3600 + 60 for m in minutes)
        w = spawn_worker("tests.apps.basic:app", s, "--queues", Q, DTQ_STATS_RETENTION_H="2")
        c.result(h.id, timeout=30)
        w.kill()
    now_s = r.time()[0]
    hours = [f"{qk.hist_base}{t // 3600}" for t in (now_s, now_s - 60)]
    key = next(k for k in hours if r.exists(k))  # (the outcome's hour: it may have just turned)
    # the outcomes' hour key is kept until its last minute is 2 hours old
    assert 2 * 3600 - 120 < r.ttl(key) <= 3 * 3600
    assert r.strlen(key) <= st.HOUR_BYTES


def test_no_history_is_kept_with_a_retention_of_zero(redis_server: Any, prefix: str) -> None:
    s = make_settings(redis_server.url, prefix, stats_retention_h=0)
    r = redis_server.client()
    with Client(settings=s) as c:
        c.enqueue("add", [1, 2], queue=Q)
        c.enqueue_many([{"name": "add", "args": [i, 2], "queue": Q} for i in range(3)])
    assert not r.keys(f"{QueueKeys(prefix, Q).hist_base}*")
    assert not r.keys(f"{QueueKeys(prefix, Q).hist_enq_base}*")


async def test_the_retention_pass_folds_closed_minutes_into_the_hour_strings(
    redis_server: Any, prefix: str, monkeypatch: Any
) -> None:
    """enqueue.lua counts in a key per minute (one INCR); the retention pass moves a closed
    minute's count into its hour string, and a read counts each task once before and after."""
    s = make_settings(redis_server.url, prefix, queues=(Q,), retention_interval_s=3600)
    r = redis_server.client()
    qk = QueueKeys(prefix, Q)
    past = int(r.time()[0]) // 60 - 3
    with monkeypatch.context() as m:  # the client's clock three minutes back
        m.setattr(enqueue_script, "time", SimpleNamespace(time=lambda: past * 60 + 1.5))
        async with AsyncClient(settings=s) as c:
            await c.enqueue("add", [1, 2], queue=Q)
            await c.enqueue_many([{"name": "add", "args": [i, 2], "queue": Q} for i in range(3)])
    now = int(time.time()) // 60
    async with AsyncClient(settings=s) as c:
        await c.enqueue("add", [1, 2], queue=Q)  # this minute's: not folded
    assert r.get(f"{qk.hist_enq_base}{past}") == "4"
    async with Admin(settings=s) as admin:
        before = {b["minute"]: b["enqueued"] for b in await admin.stats(queue=Q, minutes=10)}
        assert sum(before.values()) == 5 and before[st.iso_minute(past)] == 4
        async with running_worker(app, s.model_copy(update={"queues": ("default",)})) as w:
            await w.scheduler.retention.run_once()
        assert not r.exists(f"{qk.hist_enq_base}{past}")
        assert r.exists(f"{qk.hist_enq_base}{now}", f"{qk.hist_enq_base}{now + 1}") == 1
        hour = f"{qk.hist_base}{past // 60}"
        assert r.execute_command("BITFIELD", hour, "GET", "u32", f"#{past % 60 * st.SLOTS}") == [4]
        assert 168 * 3600 - 3600 < r.ttl(hour) <= 169 * 3600
        after = {b["minute"]: b["enqueued"] for b in await admin.stats(queue=Q, minutes=10)}
        assert {m: n for m, n in after.items() if n} == {m: n for m, n in before.items() if n}


@pytest.mark.cluster
async def test_a_partitioned_queue_sums_its_partitions(backend: Any, prefix: str) -> None:
    s = make_settings(backend.url, prefix, queues=("bulk",), queue_partitions={"bulk": 3})
    async with AsyncClient(settings=s, app=app) as c:
        hs = [await c.enqueue("add", [i, 1], queue="bulk") for i in range(12)]
        async with running_worker(app, s):
            for h in hs:
                await c.result(h.id, timeout=20)
    r = backend.client()
    now_h = r.time()[0] // 3600
    hour_keys = [f"{QueueKeys(prefix, p).hist_base}{now_h}" for p in ("bulk", "bulk~1", "bulk~2")]
    assert sum(1 for k in hour_keys if r.exists(k)) > 1  # each partition counts in its own key
    async with Admin(settings=s) as admin:
        got = totals(await admin.stats(queue="bulk", minutes=5))
        every = totals(await admin.stats(minutes=5))
        hourly = await admin.stats(queue="bulk", minutes=120, step=60)
    assert got["enqueued"] == got["succeeded"] == got["runs"] == 12
    assert every == got
    assert len(hourly) == 2 and totals(hourly) == got


def test_history_is_written_inside_the_scripts_with_no_call_of_its_own(
    redis_server: Any, prefix: str, spawn_worker: Any, tmp_path: Path
) -> None:
    """Every command that touches a history key runs inside a script (MONITOR says ``lua``):
    enqueues and outcomes cost no extra round trip."""
    s = make_settings(redis_server.url, prefix, queues=(Q,))
    r = redis_server.client()
    log = tmp_path / "monitor.txt"
    with log.open("wb") as fh:
        mon = subprocess.Popen(["redis-cli", "-p", str(redis_server.port), "monitor"], stdout=fh)
        try:
            marker = f"{prefix}:monitor-start"
            deadline = time.monotonic() + 10
            while marker not in log.read_text(errors="replace"):
                r.echo(marker)
                assert time.monotonic() < deadline, "MONITOR did not start"
                time.sleep(0.05)
            with Client(settings=s) as c:
                hs = [c.enqueue("add", [i, 1], queue=Q) for i in range(20)]
                c.enqueue_many([{"name": "add", "args": [i, 2], "queue": Q} for i in range(5)])
                w = spawn_worker("tests.apps.basic:app", s, "--queues", Q)
                for h in hs:
                    c.result(h.id, timeout=30)
                fail = c.enqueue("fail_now", queue=Q)
                with pytest.raises(Exception, match="permanent problem"):
                    c.result(fail.id, timeout=30)
                w.kill()
            marker = f"{prefix}:monitor-end"
            while marker not in log.read_text(errors="replace"):
                r.echo(marker)
                assert time.monotonic() < deadline + 30, "MONITOR lost the end marker"
                time.sleep(0.05)
        finally:
            mon.terminate()
            mon.wait(10)
    qk = QueueKeys(prefix, Q)
    lines = [
        ln
        for ln in log.read_text(errors="replace").splitlines()
        if qk.hist_base in ln or qk.hist_enq_base in ln
    ]
    in_lua = [ln for ln in lines if " lua] " in ln]
    assert any('"BITFIELD"' in ln for ln in in_lua)  # the outcomes'
    assert any('"INCR"' in ln for ln in in_lua) and any('"INCRBY"' in ln for ln in in_lua)
    writes = ('"BITFIELD"', '"INCR"', '"INCRBY"', '"EXPIRE"', '"EXPIREAT"')
    outside = [ln for ln in lines if " lua] " not in ln and any(w in ln.upper() for w in writes)]
    assert outside == []
    # the history keys are passed to the scripts as KEYS: they are written by them only
    assert all('"EVALSHA"' in ln or '"EVAL"' in ln for ln in lines if " lua] " not in ln)
