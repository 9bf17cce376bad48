"""Workflow steps moved by hand (tests/lua/test_workflow_scripts.py and the tests that build on
it): claim, complete and fail a queue's runs as worker ``W`` would, through the scripts."""

from __future__ import annotations

import json
from typing import Any

import redis

from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store.keys import Keys, QueueKeys
from tests.conftest import create_groups

W = "w1"


def qk_of(settings: Settings, queue: str) -> QueueKeys:
    return Keys(settings.key_prefix).queue(queue)


def claim(r: redis.Redis, settings: Settings, queue: str, worker: str = W) -> list[sc.Claimed]:
    qk = qk_of(settings, queue)
    create_groups(r, qk)
    return sc.parse_claim(
        queue, sc.SyncScripts(r).run(sc.claim_call(qk, worker, 100, 100, 60))
    ).runs


def complete(
    r: redis.Redis, settings: Settings, queue: str, c: sc.Claimed, result: Any, worker: str = W
) -> bool:
    qk = qk_of(settings, queue)
    s = sc.Success(c.tid, c.eid, c.attempt, "succeeded", json.dumps(result))
    return sc.parse_complete(sc.SyncScripts(r).run(sc.complete_call(qk, worker, [s], 100, 60)))[0]


def fail(r: redis.Redis, settings: Settings, queue: str, c: sc.Claimed, err: str) -> str:
    qk = qk_of(settings, queue)
    f = sc.Failure(c.tid, c.eid, c.attempt, err, None)  # no retry: ends failed
    return sc.parse_verdicts(sc.SyncScripts(r).run(sc.fail_call(qk, W, [f], 100, 60)))[0]


def args_of(r: redis.Redis, settings: Settings, queue: str, c: sc.Claimed) -> Any:
    return json.loads(r.hget(qk_of(settings, queue).task(c.tid), "args"))  # type: ignore[arg-type]


def outbox(r: redis.Redis, settings: Settings, queue: str) -> list[dict[str, str]]:
    entries = r.xrange(qk_of(settings, queue).flowq)
    return [f for _, f in entries]  # type: ignore[misc]
