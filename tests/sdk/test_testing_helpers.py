"""dtq.testing: users' tasks run in their own tests on fakeredis with dtq's real scripts."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from dtq import TaskFailed
from dtq.store.keys import Keys, split_task_id
from dtq.testing import TestQueue
from tests.apps import testing_app as ta


def test_drain_runs_tasks_and_what_they_enqueue() -> None:
    ta.sent.clear()
    with TestQueue(ta.app) as tq:
        h = ta.signup.enqueue("a@b.c")
        tq.assert_enqueued("signup", args=["a@b.c"])
        tq.assert_not_enqueued("send_email")
        assert ta.sent == []  # nothing runs before drain()
        ran = tq.drain()
        assert [i.name for i in ran] == ["signup", "send_email"]
        assert all(i.status == "succeeded" for i in ran)
        [mail] = tq.assert_enqueued("send_email", kwargs={"to": "a@b.c", "subject": "welcome"})
        assert mail.progress == {"current": 1, "total": 1, "message": "sent", "attempt": 1}
        assert tq.client.result(h.id, timeout=1) == "a@b.c"
        assert ta.sent == ["a@b.c"]
        assert tq.drain() == []
        with pytest.raises(AssertionError, match="no task"):
            tq.assert_enqueued("nope")
        with pytest.raises(AssertionError, match="1 times"):
            tq.assert_enqueued("send_email", count=2)


def test_real_semantics_retries_fail_idempotency_expiry_cancel() -> None:
    with TestQueue(ta.app) as tq:
        c = tq.client
        flaky = c.enqueue("flaky_once")
        broken = c.enqueue("broken")
        k1 = c.enqueue("send_email", kwargs={"to": "x"}, idempotency_key="k")
        k2 = c.enqueue("send_email", kwargs={"to": "y"}, idempotency_key="k")
        gone = c.enqueue("send_email", kwargs={"to": "z"})
        assert c.cancel(gone.id)
        later = c.enqueue("send_email", kwargs={"to": "later"}, delay=timedelta(hours=1))
        tq.drain()
        assert c.get(flaky.id).status == "succeeded" and c.get(flaky.id).attempt == 2
        with pytest.raises(TaskFailed) as exc:
            c.result(broken.id, timeout=1)
        assert exc.value.status == "failed" and "bad input" in (exc.value.error or "")
        assert k1.id == k2.id and c.get(k1.id).result == "sent to x"
        assert c.get(gone.id).status == "cancelled"
        assert c.get(later.id).status == "scheduled"  # not due yet
        tq.drain(include_delayed=True)
        assert c.get(later.id).status == "succeeded"


def test_eager_mode_runs_at_enqueue() -> None:
    ta.sent.clear()
    with TestQueue(ta.app, eager=True) as tq:
        h = ta.signup.enqueue("e@x.y")
        assert tq.client.get(h.id).status == "succeeded"
        assert ta.sent == ["e@x.y"]  # the nested enqueue ran too
        h2 = ta.send_email.options(priority=9).enqueue(to="p@x.y")
        assert tq.client.result(h2.id, timeout=1) == "sent to p@x.y"


async def test_eager_mode_runs_nested_enqueues_of_an_async_client() -> None:
    # The nested enqueue is made while the outer one's send is in flight (eager mode runs the
    # task inside it): it must not wait for that send to end (the client's coalescer).
    ta.sent.clear()
    with TestQueue(ta.app, eager=True) as tq:
        h = await asyncio.wait_for(ta.asignup.aenqueue("n@x.y"), 10)
        assert tq.client.get(h.id).status == "succeeded"
        assert ta.sent == ["n@x.y"]


async def test_async_tests_with_adrain_and_async_clients() -> None:
    with TestQueue(ta.app) as tq:
        h = await ta.send_email.aenqueue(to="async@x")
        ran = await tq.adrain()
        assert [i.id for i in ran] == [h.id]
        assert await ta.app.async_client().result(h.id, timeout=1) == "sent to async@x"
        h2 = await ta.send_email.aenqueue(to="sync-drain-in-async")
        assert [i.status for i in tq.drain()] == ["succeeded"]  # drain() works here too
        assert tq.client.get(h2.id).status == "succeeded"


def test_app_is_restored_after_the_block() -> None:
    before = ta.app._client
    with TestQueue(ta.app):
        assert ta.app.client() is not before
    assert ta.app._client is before
    assert "async_client" not in vars(ta.app)


def test_retry_delays_are_the_workers_capped_backoff() -> None:
    """TestQueue retries as a worker does (dtq.retrypolicy): base * 2**n, capped at
    retry_backoff_max_s. Its own formula had no cap: the 3rd retry waited 40 s, not <= 20 s."""
    with TestQueue(ta.app, retry_backoff_s=10, retry_backoff_max_s=20) as tq:
        h = tq.client.enqueue("always_errs")
        queue, tid = split_task_id(h.id)
        sched = Keys(tq.settings.key_prefix).queue(queue).sched
        waits = []
        for _ in range(5):
            tq.drain()  # one attempt: it fails and its retry waits in the schedule
            due = tq.redis.zscore(sched, tid)
            assert due is not None
            waits.append(due - time.time() * 1000)
            tq.redis.zadd(sched, {tid: 0})  # due now: the next drain runs it
        assert all(w <= 20_000 for w in waits), waits
        assert waits[0] >= 4_000  # base 10 s times a jitter factor of at least 0.5 (minus slack)


def test_a_timeout_fails_as_on_a_worker() -> None:
    with TestQueue(ta.app) as tq:
        h = tq.client.enqueue("slow", max_retries=0)
        tq.drain()
        info = tq.client.get(h.id)
        assert info.status.value == "failed"
        assert info.error == "timed out after 0.05s"  # a worker's words, no exception name
