"""The queue registry (P:queues) stays bounded: retention forgets a name whose queue holds no
work and that no live worker consumes (a typo'd name does not stay listed forever)."""

from __future__ import annotations

import redis

from dtq import Client
from dtq.admin import Admin
from dtq.settings import Settings
from dtq.store.keys import Keys
from tests.apps.limited import app
from tests.conftest import running_worker


async def test_retention_forgets_queue_names_that_hold_nothing(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings.model_copy(update={"retention_interval_s": 3600})
    keys = Keys(s.key_prefix)
    with Client(settings=s) as c:
        c.enqueue("nop", queue="typo")  # a typo'd queue name...
        c.enqueue("nop", queue="busy")  # ...and a queue with a task waiting for its worker
        c.enqueue("nop", queue="sched", delay=3600)
        c.enqueue("nop", queue="later")
    async with Admin(s) as a:
        await a.purge("typo")  # the typo's task is purged
        await a.purge("later")
        await a.pause("later")  # paused on purpose: kept
    r.sadd(keys.queues, "never")  # registered, no key at all
    async with running_worker(app, s) as w:  # consumes "default" (empty)
        ret = w.scheduler.retention
        first = await ret.run_once()
        assert r.sismember(keys.queues, "typo"), "forgotten on the first look"
        second = await ret.run_once()
        assert first.queues_forgotten == 0 and second.queues_forgotten == 2
        assert sorted(r.smembers(keys.queues)) == ["busy", "default", "later", "sched"]
        # The forgotten queue's empty keys are gone too (a purge's kept reply expires by itself).
        left = [k for k in r.scan_iter(f"{keys.prefix}:{{{keys.prefix}:typo}}*") if r.ttl(k) < 0]
        assert not left
    # A name used again is registered again by the client that uses it.
    with Client(settings=s) as c:
        c.enqueue("nop", queue="typo")
    assert r.sismember(keys.queues, "typo")


async def test_retention_registers_again_a_forgotten_queue_that_got_tasks(
    settings: Settings, r: redis.Redis
) -> None:
    """A long-lived client registered a name once and does not again; once retention forgot the
    name, the client's next tasks there are found by retention's key scan and listed again."""
    s = settings.model_copy(update={"retention_interval_s": 3600})
    keys = Keys(s.key_prefix)
    with Client(settings=s) as c:
        c.enqueue("nop", queue="late")
        async with Admin(s) as a:
            await a.purge("late")
        async with running_worker(app, s) as w:
            ret = w.scheduler.retention
            await ret.run_once()
            await ret.run_once()
            assert not r.sismember(keys.queues, "late")
            c.enqueue("nop", queue="late")  # the same client: it does not register again
            assert not r.sismember(keys.queues, "late")
            ret.cursor = "0"  # the next pass's scan starts over (it goes on where it stopped)
            rep = await ret.run_once()
            assert rep.queues_registered == 1 and r.sismember(keys.queues, "late")
            await ret.run_once()
            assert r.sismember(keys.queues, "late"), "a queue with a waiting task was forgotten"
