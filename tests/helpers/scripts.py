"""Lua transitions called by hand (tests/lua/test_scripts.py and the tests that build on it):
raw keys in, parsed replies out, through the ``run`` fixture of tests/conftest.py."""

from __future__ import annotations

from typing import Any

import redis

from dtq import scripts as sc
from dtq.store.keys import QueueKeys, new_tid
from tests.conftest import create_groups

Q = "q1"


def task(
    prio: int = 5, delay_ms: int = 0, idem: str = "", max_retries: int = 3, **kw: Any
) -> sc.NewTask:
    base: dict[str, Any] = dict(
        tid=new_tid(), name="t", args="[1]", kwargs="", priority=prio, max_retries=max_retries,
        timeout=None, delay_ms=delay_ms, expires_ms=0, idempotency_key=idem, meta="",
    )  # fmt: skip
    base.update(kw)
    return sc.NewTask(**base)


def enqueue(run: Any, qk: QueueKeys, *tasks: sc.NewTask) -> list[sc.Enqueued]:
    return sc.parse_enqueue(run(sc.enqueue_call(qk, list(tasks), 100)))


def claim(run: Any, qk: QueueKeys, worker: str = "w1", count: int = 10) -> sc.ClaimBatch:
    return sc.parse_claim(Q, run(sc.claim_call(qk, worker, count, 100, 60)))


def started(run: Any, r: redis.Redis, qk: QueueKeys, t: sc.NewTask | None = None) -> sc.Claimed:
    create_groups(r, qk)
    t = t or task()
    enqueue(run, qk, t)
    return claim(run, qk).runs[0]
