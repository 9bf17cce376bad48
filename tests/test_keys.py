"""Every key dtq creates is one the key schema documents, so retention and purge know them all."""

from __future__ import annotations

import re

import pytest
import redis

from dtq import AsyncClient, Settings, TaskFailed
from dtq import keys as keys_module
from dtq.keys import Keys
from tests.apps.basic import app
from tests.conftest import running_worker


def documented_patterns(prefix: str) -> list[re.Pattern[str]]:
    """Turn the layout in dtq/keys.py's docstring into regexes for one prefix."""
    doc = keys_module.__doc__ or ""
    out = []
    for line in doc.splitlines():
        m = re.match(r"\s+(P:\S+)(?:\s+\.\.\s+(P:\S+))?\s", line + " ")
        if not m:
            continue
        pat = m.group(1)
        if m.group(2):  # "P:{q}:p0 .. P:{q}:p9"
            pat = pat[:-1] + "<band>"
        rx = re.escape(pat)
        rx = rx.replace(re.escape("{q}"), r"\{" + re.escape(prefix) + r":[A-Za-z0-9_.\-]+\}")
        rx = re.sub(r"<band>", "[0-9]", rx)
        rx = re.sub(r"<[a-z]+>", ".+", rx)
        rx = rx.replace("P", re.escape(prefix), 1)
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
        assert not undocumented, f"keys missing from dtq/keys.py's layout: {undocumented}"
        # The test saw the main kinds of key (it is not vacuous).
        assert len(found) >= 15
