"""A blocking ``Client``'s group commit of single enqueues (dtq/sdk/coalesce.py, SyncCoalescer):
the enqueues that many threads make while one is in flight go out as one bulk call, sent by
the oldest of them; nothing is lost, doubled or left waiting on the way (a failed batch, a
waiter interrupted, a fork while a call is in flight). Real redis-servers (paused with
SIGSTOP, killed), real threads, a real forked child."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from dtq import BatchInterrupted, Client, DtqError, RedisUnavailable, Settings
from dtq.sdk.coalesce import SyncCoalescer, _interrupted
from tests.conftest import make_settings, reap, wait_until
from tests.helpers import evalsha_calls, stream_args
from tests.redis_server import RedisServer

N = 200


def _waiting(c: Client, queue: str = "default") -> int:
    """How many enqueues of ``queue`` wait for the one in flight."""
    co = c._coalesced
    assert co is not None
    return len(co._waiting.get(queue, ()))


def _busy(c: Client, queue: str = "default") -> bool:
    """Whether an enqueue of ``queue`` is in flight (later ones wait for it)."""
    co = c._coalesced
    assert co is not None
    return queue in co._waiting


def _held(server: RedisServer, c: Client, pool: ThreadPoolExecutor, arg: int) -> Future[Any]:
    """An enqueue of ``arg`` made in ``pool`` and held in flight: the server is paused (the
    caller resumes or stops it), so the enqueues made next wait for it."""
    server.pause()
    first = pool.submit(c.enqueue, "job", args=[arg])
    wait_until(lambda: _busy(c))
    return first


def _in_threads(fns: Sequence[Any]) -> list[Any]:
    """Each of ``fns`` called in a thread of its own, all let go together; what each returned
    (or raised)."""
    gate = threading.Barrier(len(fns))

    def one(fn: Any) -> Any:
        gate.wait()
        try:
            return fn()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(one, fns))


@pytest.mark.cluster
def test_concurrent_enqueues_from_threads_are_each_made_once(
    settings: Settings, r: redis.Redis
) -> None:
    with Client(settings=settings) as c:
        got = _in_threads([lambda i=i: c.enqueue("job", args=[i]) for i in range(N)])
    errors = [g for g in got if isinstance(g, Exception)]
    assert not errors, errors[:1]
    assert len({h.id for h in got}) == N and all(h.created for h in got)
    made = stream_args(r, settings)
    assert sorted(made) == list(range(N))  # one entry each


@pytest.mark.parametrize("coalesce", [True, False])
def test_enqueues_made_while_one_is_in_flight_go_out_in_one_call(
    fresh_redis: RedisServer, prefix: str, coalesce: bool
) -> None:
    s = make_settings(fresh_redis.url, prefix, client_coalesce=coalesce)
    r = fresh_redis.client()  # (a server of its own: no other test's calls in the count)
    n = 50
    with Client(settings=s) as c, ThreadPoolExecutor(n) as pool:
        c.enqueue("job", args=[-1])  # registers the queue, loads the script
        before = evalsha_calls(r)
        fresh_redis.pause()  # the first enqueue stays in flight while the others are made
        try:
            first = pool.submit(c.enqueue, "job", args=[0])
            if coalesce:
                wait_until(lambda: _busy(c))
            else:
                time.sleep(0.2)
            rest = [pool.submit(c.enqueue, "job", args=[i]) for i in range(1, n)]
            if coalesce:
                wait_until(lambda: _waiting(c) == n - 1)
            else:
                time.sleep(0.5)
        finally:
            fresh_redis.resume()
        handles = [f.result(30) for f in [first, *rest]]
        calls = evalsha_calls(r) - before
    assert len({h.id for h in handles}) == n and all(h.created for h in handles)
    made = stream_args(r, s)[1:]
    if coalesce:
        # The first alone, the other 49 in one batch in the order they waited (the order
        # their threads came to it, which the pool's start order does not fix).
        assert calls == 2 and made[0] == 0 and sorted(made) == list(range(n))
    else:
        assert calls == n and sorted(made) == list(range(n))
    r.close()


def test_a_failed_batch_raises_in_each_of_its_callers(
    fresh_redis: RedisServer, prefix: str
) -> None:
    s = make_settings(fresh_redis.url, prefix, client_retries=0)
    with Client(settings=s) as c, ThreadPoolExecutor(6) as pool:
        c.enqueue("job", args=[0])
        first = _held(fresh_redis, c, pool, 1)
        rest = [pool.submit(c.enqueue, "job", args=[i]) for i in range(2, 6)]
        wait_until(lambda: _waiting(c) == 4)
        fresh_redis.stop()  # (killed while stopped: its connections are reset)
        done = [f.exception(30) for f in [first, *rest]]
        assert all(isinstance(x, RedisUnavailable) for x in done), done
        # Nothing of the queue is left busy: the next enqueue goes out (and meets no server).
        assert not _busy(c)


def test_an_idempotency_key_in_one_batch_makes_one_task(
    fresh_redis: RedisServer, prefix: str
) -> None:
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    with Client(settings=s) as c, ThreadPoolExecutor(4) as pool:
        c.enqueue("job", args=[0])
        try:
            first = _held(fresh_redis, c, pool, 1)
            same = [
                pool.submit(c.enqueue, "job", args=[2], idempotency_key="once") for _ in range(3)
            ]
            wait_until(lambda: _waiting(c) == 3)
        finally:
            fresh_redis.resume()
        hs = [f.result(30) for f in same]
        assert first.result(30).created
    assert len({h.id for h in hs}) == 1
    assert sorted(h.created for h in hs) == [False, False, True]
    assert stream_args(r, s) == [0, 1, 2]
    r.close()


def test_a_forked_child_enqueues_while_the_parents_call_is_in_flight(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """A pre-forking server forks while one of the parent's threads has an enqueue in flight:
    the child's enqueue of the same queue goes out (before, it would have waited for ever for
    the parent's call, whose thread the child does not have)."""
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    with Client(settings=s) as c, ThreadPoolExecutor(1) as pool:
        c.enqueue("job", args=[0])
        try:
            parent = _held(fresh_redis, c, pool, 1)
            pid = os.fork()
            if pid == 0:  # the child: its enqueue must be answered
                code = 1
                try:
                    signal.alarm(20)  # (SIGALRM ends a child left waiting: the test fails)
                    code = 0 if c.enqueue("job", args=[2]).created else 3
                finally:
                    os._exit(code)
        finally:
            fresh_redis.resume()
        assert reap(pid) == 0
        assert parent.result(30).created
    assert sorted(stream_args(r, s)) == [0, 1, 2]
    r.close()


class _Calls:
    """A stand-in for the client's calls, for the interruption tests (no Redis: what matters is
    which thread sends what, and that no caller is left waiting)."""

    def __init__(self) -> None:
        self.in_flight = threading.Event()
        self.go_on = threading.Event()
        self.batches: list[list[int]] = []

    def one(self, item: int) -> int:
        self.in_flight.set()
        assert self.go_on.wait(10)
        return item * 10

    def many(self, key: str, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        return [i * 10 for i in items]


def _thread(fn: Any, *args: Any) -> Future[Any]:
    """``fn(*args)`` in a daemon thread (one left waiting fails its test, not the session)."""
    out: Future[Any] = Future()

    def run() -> None:
        try:
            out.set_result(fn(*args))
        except BaseException as exc:
            out.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


def _interrupt_when(cond: Any) -> None:
    """Raise KeyboardInterrupt in the main thread once ``cond()`` holds (SIGALRM's handler
    runs in the main thread, inside the wait it interrupts)."""

    def handler(signum: int, frame: Any) -> None:
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.2)


def test_an_interrupted_waiter_is_left_out_of_the_batch() -> None:
    calls = _Calls()
    co: SyncCoalescer[str, int, int] = SyncCoalescer(calls.many)
    old = signal.getsignal(signal.SIGALRM)
    try:
        first = _thread(co.call, "q", 1, lambda: calls.one(1))
        assert calls.in_flight.wait(10)
        _interrupt_when(lambda: len(co._waiting["q"]) == 1)
        with pytest.raises(KeyboardInterrupt):
            co.call("q", 2, lambda: calls.one(2))
        calls.go_on.set()
        assert first.result(10) == 10
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert calls.batches == [] and co._waiting == {}
    assert co.call("q", 3, lambda: 30) == 30  # the queue is idle again


def test_a_waiter_interrupted_when_it_is_to_send_its_batch_sends_it() -> None:
    """The interrupted thread was the oldest waiter, chosen to send the batch the others wait
    for: it sends it before raising, so they get their answers."""
    calls = _Calls()
    co: SyncCoalescer[str, int, int] = SyncCoalescer(calls.many)
    old = signal.getsignal(signal.SIGALRM)
    try:
        first = _thread(co.call, "q", 1, lambda: calls.one(1))
        assert calls.in_flight.wait(10)

        def chosen() -> bool:  # (the main thread's item waits first, then the other's)
            waiting = co._waiting.get("q")
            if waiting is not None and len(waiting) == 2:
                calls.go_on.set()  # the call in flight ends: the main thread is chosen
            return calls.go_on.is_set() and bool(co._waiting.get("q") == [])

        def other() -> int:
            wait_until(lambda: len(co._waiting.get("q") or ()) == 1)
            return co.call("q", 3, lambda: calls.one(3))

        later = _thread(other)
        _interrupt_when(chosen)
        with pytest.raises(KeyboardInterrupt):
            co.call("q", 2, lambda: calls.one(2))
        assert first.result(10) == 10
        assert later.result(10) == 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert calls.batches == [[2, 3]] and co._waiting == {}


def test_a_call_made_inside_a_send_goes_out_on_its_own() -> None:
    """A call of the coalescer made by the thread that is sending (dtq.testing's eager mode
    runs the task, which enqueues, inside the enqueue's send) is sent at once: it cannot wait
    for the send it is part of. From a lone call's send and from a batch's."""
    calls = _Calls()
    nested: list[int] = []

    def many(key: str, items: Sequence[int]) -> list[int]:
        nested.append(co.call(key, 100 + items[0], lambda: 1000 + items[0]))
        return calls.many(key, items)

    co: SyncCoalescer[str, int, int] = SyncCoalescer(many)

    def lone() -> int:
        nested.append(co.call("q", 7, lambda: 70))  # the same key, and another one
        nested.append(co.call("other", 8, lambda: 80))
        return calls.one(1)

    first = _thread(co.call, "q", 1, lone)
    assert calls.in_flight.wait(10)
    waiter = _thread(co.call, "q", 2, lambda: -1)
    wait_until(lambda: len(co._waiting.get("q") or ()) == 1)
    calls.go_on.set()
    assert first.result(10) == 10 and waiter.result(10) == 20
    assert nested == [70, 80, 1002] and calls.batches == [[2]] and co._waiting == {}


def _interrupt_inside(name: str) -> None:
    """Raise KeyboardInterrupt in the main thread once it runs inside a function called
    ``name`` (SIGALRM's handler runs in the main thread and sees the frame it interrupted;
    elsewhere it only sets the alarm again)."""

    def handler(signum: int, frame: Any) -> None:
        f = frame
        while f is not None:
            if f.f_code.co_name == name:
                raise KeyboardInterrupt
            f = f.f_back
        signal.setitimer(signal.ITIMER_REAL, 0.02)

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.02)


def test_a_batch_interrupted_in_its_sending_thread_is_sent_again_for_the_others(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """The main thread sends a batch (it waited first) and gets a KeyboardInterrupt while the
    batch is in flight on a paused server: the other thread of the batch gets its own task's
    handle, its task made once, never the main thread's KeyboardInterrupt (which it got
    before). The main thread's own enqueue may or may not have been made (at most once)."""
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    old = signal.getsignal(signal.SIGALRM)
    with Client(settings=s) as c:
        c.enqueue("job", args=[0])
        co = c._coalesced
        assert co is not None
        release = threading.Event()
        # A call of the queue in flight (a stand-in: it must end while the server stays paused).
        first = _thread(co.call, "default", None, lambda: release.wait(10))
        wait_until(lambda: _busy(c))

        def other() -> Any:
            wait_until(lambda: _waiting(c) == 1)  # after the main thread's: it sends the batch
            return c.enqueue("job", args=[2])

        def hold_the_batch() -> None:
            wait_until(lambda: _waiting(c) == 2)
            fresh_redis.pause()
            release.set()

        later = _thread(other)
        held = _thread(hold_the_batch)
        try:
            _interrupt_inside("_enqueue_batch")
            with pytest.raises(KeyboardInterrupt):
                c.enqueue("job", args=[1])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            held.exception(10)
            fresh_redis.resume()
        assert first.result(10) is True
        err = later.exception(30)
        assert err is None, repr(err)
        h = later.result(0)
        assert h.created
        made = stream_args(r, s)
        assert made.count(2) == 1 and made.count(1) <= 1, made
        assert c.get(h.id).status == "queued"
        assert not _busy(c)
    r.close()


def test_other_threads_of_an_interrupted_batch_send_their_item_again_alone() -> None:
    """The coalescer cannot know whether an interrupted batch reached Redis: the other callers
    of the batch send their item again alone (``send_one``, safe to repeat), never getting the
    sending thread's KeyboardInterrupt; the sender gets its own. What they are told meanwhile
    is a ``BatchInterrupted`` (a ``DtqError``), set on their place."""
    calls = _Calls()
    co: SyncCoalescer[str, int, int] = SyncCoalescer(calls.many)
    old = signal.getsignal(signal.SIGALRM)
    try:
        first = _thread(co.call, "q", 1, lambda: calls.one(1))
        assert calls.in_flight.wait(10)

        def other() -> int:
            wait_until(lambda: len(co._waiting.get("q") or ()) == 1)
            return co.call("q", 3, lambda: calls.one(3))

        def interrupted_send(key: str, items: Sequence[int]) -> list[int]:
            raise KeyboardInterrupt

        co._send_many = interrupted_send
        later = _thread(other)
        threading.Thread(
            target=lambda: (wait_until(lambda: len(co._waiting["q"]) == 2), calls.go_on.set()),
            daemon=True,
        ).start()
        with pytest.raises(KeyboardInterrupt):
            co.call("q", 2, lambda: calls.one(2))
        assert first.result(10) == 10
        assert later.exception(10) is None and later.result(10) == 30  # sent again, alone
        err = _interrupted(KeyboardInterrupt())
        assert isinstance(err, BatchInterrupted) and isinstance(err, DtqError)
        assert "interrupted" in str(err)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert co._waiting == {}
