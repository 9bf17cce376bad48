"""Every key dtq creates is one the key schema documents, so retention and purge know them all."""

from __future__ import annotations

import os
import re
import threading

import pytest
import redis

from dtq import AsyncClient, Settings, TaskFailed
from dtq.store.keys import Keys, layout, new_tid
from tests.apps.basic import app
from tests.conftest import running_worker


def documented_patterns(prefix: str) -> list[re.Pattern[str]]:
    """The layout dtq.store.keys.layout describes, as regexes for one prefix."""
    out = []
    for doc in layout(prefix, "<q>"):
        rx = re.escape(doc.key).replace(re.escape("<q>"), r"[A-Za-z0-9_.\-]+")
        rx = rx.replace(re.escape("<band>"), "[0-9]")
        rx = re.sub(re.escape("<") + "[a-z]+" + re.escape(">"), ".+", rx)
        out.append(re.compile(rx + "$"))
    return out


def test_patterns_parse() -> None:
    pats = documented_patterns("x")
    assert any(p.match("x:{x:default}:p7") for p in pats)
    assert any(p.match("x:{x:default}:t:0123") for p in pats)
    assert not any(p.match("x:{x:default}:nope") for p in pats)


@pytest.mark.slow
async def test_every_key_a_workload_creates_is_documented(
    settings: Settings, r: redis.Redis
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        ok = await c.enqueue("add", [1, 2], idempotency_key="k1", metadata={"a": 1})
        bad = await c.enqueue("fail_now")
        later = await c.enqueue("add", [1, 1], delay=60)
        retry = await c.enqueue("flaky", [1])
        gone = await c.enqueue("add", [1, 1], queue="other")
        await c.cancel(gone.id)
        await c.result(ok.id, timeout=10)
        await c.result(retry.id, timeout=10)
        with pytest.raises(TaskFailed):
            await c.result(bad.id, timeout=10)
        assert (await c.get(later.id)).status.value == "scheduled"
        r.set(Keys(settings.key_prefix).queue("default").paused, 1)
        found = sorted(r.scan_iter(match=f"{settings.key_prefix}:*", count=1000))
        pats = documented_patterns(settings.key_prefix)
        undocumented = [k for k in found if not any(p.match(k) for p in pats)]
        assert not undocumented, f"keys missing from dtq.store.keys.layout: {undocumented}"
        # The test saw the main kinds of key (it is not vacuous).
        assert len(found) >= 15


def test_task_ids_are_unique_across_threads_and_a_fork() -> None:
    got: list[list[str]] = [[] for _ in range(8)]

    def make(out: list[str]) -> None:
        out.extend(new_tid() for _ in range(2000))

    threads = [threading.Thread(target=make, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for g in got for i in g]
    assert len(set(ids)) == len(ids) == 16000
    assert all(len(i) == 28 and int(i, 16) >= 0 for i in ids)
    # A child forked with part of the pool left must not hand out the parent's next parts.
    new_tid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, ",".join(new_tid()[12:] for _ in range(100)).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as fh:
        child = set(fh.read().split(","))
    parent = {new_tid()[12:] for _ in range(100)}
    assert len(child) == 100 and not child & parent
