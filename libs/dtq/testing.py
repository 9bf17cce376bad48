"""Run your tasks inside your own test suite, without a Redis server: ``dtq.testing``.

The queue lives in an in-memory `fakeredis` server that runs dtq's own Lua scripts, so states,
retries, ``dtq.Fail``/``dtq.Retry``, expiry, idempotency keys, unique tasks, cancellation and
progress behave as in production. Nothing runs until you call :meth:`TestQueue.drain` (or
use ``eager=True``)::

    from dtq.testing import TestQueue
    from myproj.tasks import app, send_email

    def test_signup_sends_a_mail():
        with TestQueue(app) as tq:
            signup("a@b.c")                      # your code enqueues send_email
            tq.assert_enqueued("myproj.tasks.send_email", kwargs={"to": "a@b.c"})
            [info] = tq.drain()                  # runs everything due, retries included
            assert info.status == "succeeded"

Each task runs as a worker runs it (:mod:`dtq.run`, :mod:`dtq.retrypolicy`, the app's
middleware); the differences (one at a time, no sync timeout, retries due at once) are in
docs/lifecycle.md, "Testing your tasks".
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import chain
from typing import Any, ParamSpec, TypeVar

try:
    import fakeredis
except ImportError as exc:  # the `testing` extra: not every user of dtq needs it
    raise ImportError("dtq.testing needs fakeredis: pip install 'dtq[testing]'") from exc

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.app import App
from dtq.context import set_current
from dtq.models import TaskHandle, TaskInfo
from dtq.retrypolicy import failure_item, result_item
from dtq.run import Attempt, Runner
from dtq.schedules import ScheduleRunner
from dtq.schedules import declared as declared_schedules
from dtq.sdk.client import AsyncClient, Client
from dtq.settings import Settings
from dtq.store.cluster import task_key_pages
from dtq.store.keys import GROUP, Keys, make_task_id, split_task_id
from dtq.store.partitions import within
from dtq.store.record import Field

__all__ = ["TestQueue"]

WORKER_ID = "dtq-testing"
P = ParamSpec("P")
T = TypeVar("T")


class _Inline(Executor):
    """Runs a sync body at once, in the calling thread (so its timeout is not enforced)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        f: Future[T] = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a pool thread hands it over
            f.set_exception(exc)
        return f


class _Runner(Runner):
    """The worker's runner on the fake server: a run is stopped once its cancel is stored."""

    def __init__(self, tq: TestQueue) -> None:
        r = fakeredis.FakeAsyncRedis(server=tq.server, decode_responses=True)
        s = tq.settings
        super().__init__(tq.app, _Inline(), WORKER_ID, sc.AsyncScripts(r), tq.keys, s.events_maxlen)
        self.tq = tq

    def stopped(self, run: Attempt) -> bool:
        c = run.claimed
        return bool(self.tq.redis.hexists(self.keys.queue(c.queue).task(c.tid), Field.CANCEL))


class TestQueue:
    """An in-memory dtq for tests, bound to ``app`` while the ``with`` block runs.

    Inside the block ``task.enqueue(...)``, ``app.client()`` and ``app.async_client()`` talk to
    the fake server. ``eager=True`` runs each task as soon as it is enqueued (and what it
    enqueues in turn), as if a worker were infinitely fast.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, *, eager: bool = False, **settings: Any) -> None:
        self.app = app
        self.eager = eager
        self.server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeRedis(server=self.server, decode_responses=True)
        base: dict[str, Any] = {
            "redis_url": "redis://dtq-testing:6379/0",
            "key_prefix": "dtq-test",
            "retry_backoff_s": 0.0,
            "retry_backoff_max_s": 0.0,
            "client_warn_undeclared": False,  # (no worker: the TestQueue runs the tasks itself)
        }
        base.update(settings)
        self.settings = Settings(**base)
        self.keys = Keys(self.settings.key_prefix)
        self._scripts = sc.SyncScripts(self.redis)
        self.client: Client = _TestClient(
            self, settings=self.settings, app=app, redis_client=self.redis
        )
        self._aclients: dict[int, AsyncClient] = {}
        self._draining = threading.local()
        self._saved: tuple[Settings | None, Client | None] | None = None
        self._offset_ms = 0  # the test clock's lead over the real one (advance())

    # --- binding to the app -----------------------------------------------------------------

    def __enter__(self) -> TestQueue:
        app = self.app
        self._saved = (app._settings, app._client)
        app._settings = self.settings
        app._client = self.client
        # (its own per-loop clients, app._aclients, are not used while bound)
        app.async_client = self._async_client  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        app = self.app
        assert self._saved is not None
        app._settings, app._client = self._saved
        del app.async_client
        self.redis.close()

    def _async_client(self) -> AsyncClient:
        loop = id(asyncio.get_running_loop())
        if loop not in self._aclients:
            r = fakeredis.FakeAsyncRedis(server=self.server, decode_responses=True)
            self._aclients[loop] = _TestAsyncClient(
                self, settings=self.settings, app=self.app, redis_client=r
            )
        return self._aclients[loop]

    # --- inspecting -------------------------------------------------------------------------

    def tasks(self, name: str | None = None, queue: str | None = None) -> list[TaskInfo]:
        """Every task enqueued so far (any state), oldest first, optionally filtered."""
        out = []
        found: Any = self.redis.smembers(self.keys.queues)
        for q in within(queue, found) if queue else sorted(found):
            base = self.keys.queue(q).task_base
            for key in chain.from_iterable(task_key_pages(self.redis, self.keys.queue(q), 500)):
                rec: dict[str, str] = self.redis.hgetall(key)  # type: ignore[assignment]
                if rec and (name is None or rec.get(Field.NAME) == name):
                    out.append(TaskInfo.from_record(make_task_id(q, key[len(base) :]), q, rec))
        return sorted(out, key=lambda i: (i.enqueued_at is None, i.enqueued_at, i.id))

    def enqueued(
        self,
        name: str | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        *,
        group: str | None = None,
    ) -> list[TaskInfo]:
        """Tasks enqueued so far matching name, exact args and/or exact kwargs (and the fair
        group, when given: ``TaskInfo.group``)."""
        return [
            t
            for t in self.tasks(name, queue)
            if (args is None or t.args == list(args))
            and (kwargs is None or t.kwargs == dict(kwargs))
            and (group is None or t.group == group)
        ]

    def assert_enqueued(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        group: str | None = None,
        count: int | None = None,
    ) -> list[TaskInfo]:
        """Assert that such a task was enqueued (``count`` times, if given); return them."""
        found = self.enqueued(name, args, kwargs, queue, group=group)
        in_group = "" if group is None else f", group={group!r}"
        want = f"{name}(args={args!r}, kwargs={kwargs!r}{in_group})"
        if count is None and not found:
            seen = [f"{t.name}{tuple(t.args)}{t.kwargs or ''}" for t in self.tasks()]
            raise AssertionError(f"no task {want} was enqueued; enqueued: {seen}")
        if count is not None and len(found) != count:
            raise AssertionError(f"{want} enqueued {len(found)} times, expected {count}")
        return found

    def assert_not_enqueued(
        self, name: str, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.assert_enqueued(name, args, kwargs, count=0)

    # --- running ----------------------------------------------------------------------------

    def drain(self, *, include_delayed: bool = False, max_runs: int = 10_000) -> list[TaskInfo]:
        """Run every task that is due, and what they enqueue, until nothing is due.

        Returns the final state of each task that ran, in the order they ran.
        ``include_delayed=True`` also runs delayed tasks before their time.
        """
        return _blocking(self.adrain(include_delayed=include_delayed, max_runs=max_runs))

    # --- the test clock: periodic schedules and delayed tasks ------------------------------

    def now(self) -> datetime:
        """The test clock: the real time plus what :meth:`advance` added."""
        return datetime.fromtimestamp(self._now_ms() / 1000, tz=UTC)

    def _now_ms(self) -> int:
        return int(time.time() * 1000) + self._offset_ms

    def fire_due(self) -> list[str]:
        """Fire every periodic schedule due at the test clock, as a worker's scheduler would
        (grace, overlap and catch-up rules included). Returns the ids of the tasks enqueued;
        :meth:`drain` runs them. The app's declared schedules are stored on the first call."""
        return _blocking(self.afire_due())

    def advance(self, seconds: float) -> list[str]:
        """Move the test clock ``seconds`` forward, firing each periodic schedule at each of its
        fire times on the way, in order (an ``every=30`` schedule fires 4 times in
        ``advance(120)``). Delayed tasks and retries due by then run on the next
        :meth:`drain`. Returns the ids of the tasks fired."""
        return _blocking(self.aadvance(seconds))

    async def afire_due(self) -> list[str]:
        """:meth:`fire_due` for async tests."""
        return await self._fire(self._runner())

    async def aadvance(self, seconds: float, max_fires: int = 100_000) -> list[str]:
        """:meth:`advance` for async tests."""
        if seconds < 0:
            raise ValueError("the test clock only moves forward")
        runner = self._runner()
        fired = await self._fire(runner)  # stores the declared schedules at the old time
        target = self._now_ms() + int(seconds * 1000)
        for _ in range(max_fires):
            upcoming = self._next_fire_ms()
            if upcoming is None or upcoming > target:
                break
            self._offset_ms += max(0, upcoming - self._now_ms())
            fired += await self._fire(runner)
        else:
            raise RuntimeError(f"advance() stopped after {max_fires} schedule fires")
        self._offset_ms += max(0, target - self._now_ms())
        fired += await self._fire(runner)
        return fired

    def _next_fire_ms(self) -> int | None:
        """The soonest next fire time of any stored schedule."""
        firsts: list[Any] = [
            self.redis.zrange(self.keys.queue(q).schedules_next, 0, 0, withscores=True)
            for q in self._schedule_queues()
        ]
        return min((int(first[0][1]) for first in firsts if first), default=None)

    def _runner(self) -> ScheduleRunner:
        r = fakeredis.FakeAsyncRedis(server=self.server, decode_responses=True)
        runner = ScheduleRunner(r, sc.AsyncScripts(r), self.keys, self.settings, self.app)
        runner.now_ms = self._async_now  # type: ignore[method-assign]
        return runner

    async def _async_now(self) -> int:
        return self._now_ms()

    def _schedule_queues(self) -> list[str]:
        queues: set[str] = set(self.redis.smembers(self.keys.queues))  # type: ignore[arg-type]
        queues.update(s.queue for s in declared_schedules(self.app))
        return sorted(queues)

    async def _fire(self, runner: ScheduleRunner) -> list[str]:
        fired: list[str] = []
        for q in self._schedule_queues():
            qk = self.keys.queue(q)
            before: dict[str, str] = self.redis.hgetall(qk.schedules_last)  # type: ignore[assignment]
            runner._next_sync.pop(q, None)  # code-declared schedules synced on every call
            await runner.tick(q)
            after: dict[str, str] = self.redis.hgetall(qk.schedules_last)  # type: ignore[assignment]
            fired += [make_task_id(q, tid) for n, tid in after.items() if before.get(n) != tid]
        if fired:
            self.redis.sadd(self.keys.queues, *{split_task_id(t)[0] for t in fired})
            self._after_enqueue()
        return fired

    async def adrain(
        self, *, include_delayed: bool = False, max_runs: int = 10_000
    ) -> list[TaskInfo]:
        """:meth:`drain` for async tests: async tasks run on the caller's event loop."""
        if getattr(self._draining, "on", False):
            return []  # eager enqueue from inside a task: the outer drain picks it up
        self._draining.on = True
        ran: dict[str, None] = {}
        runner = _Runner(self)
        try:
            for _ in range(max_runs):
                if (runs := self._claim_one(include_delayed)) is None:
                    break
                queue, c = runs
                await self._run(runner, queue, c)
                ran[make_task_id(queue, c.tid)] = None
            else:
                raise RuntimeError(f"drain() stopped after {max_runs} runs: a task loop?")
        finally:
            self._draining.on = False
        return [self.client.get(i) for i in ran]

    def _move_handovers(self, queues: list[str]) -> None:
        """Move every workflow handover waiting in the queues' outboxes, as workers do
        (dtq_worker.flowmover): a step on another queue than its flow's home."""
        moved = True
        while moved:
            moved = False
            for q in queues:
                entries: Any = self.redis.xrange(self.keys.queue(q).flowq)
                for eid, fields in entries:
                    call = wf.handover_call(self.keys, self.settings, fields)
                    if call is not None:
                        self._scripts.run(call)
                    self.redis.xdel(self.keys.queue(q).flowq, eid)
                    marker = wf.put_marker(self.keys, fields)
                    if marker is not None:
                        self.redis.expire(marker, self.settings.result_ttl_s)
                    moved = True

    def _claim_one(self, include_delayed: bool) -> tuple[str, sc.Claimed] | None:
        s = self.settings
        members: Any = self.redis.smembers(self.keys.queues)
        self._move_handovers(sorted(members))
        q: str
        for q in sorted(members):
            qk = self.keys.queue(q)
            if include_delayed or self._offset_ms:
                # Due now (for promote.lua, on the real clock): every delayed task, or those
                # due by the test clock.
                top = "+inf" if include_delayed else self._now_ms()
                due: Any = self.redis.zrange(qk.sched, "-inf", top, byscore=True)
                if due:
                    self.redis.zadd(qk.sched, dict.fromkeys(due, 0))
            self._scripts.run(sc.promote_call(qk, 1000, s.events_maxlen))
            for _ in range(2):
                raw = self._scripts.run(
                    sc.claim_call(qk, WORKER_ID, 1, s.events_maxlen, s.result_ttl_s)
                )
                batch = sc.parse_claim(q, raw)
                if not batch.missing_streams:
                    break
                for stream in qk.streams:
                    try:
                        self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
                    except Exception as exc:
                        if "BUSYGROUP" not in str(exc):
                            raise
            if batch.runs:
                return q, batch.runs[0]
        return None

    async def _run(self, runner: _Runner, queue: str, c: sc.Claimed) -> None:
        s = self.settings
        qk = self.keys.queue(queue)
        run = Attempt(c)
        item: sc.Success | sc.Failure
        # The worker's own rules run the body and turn its end into the outcome.
        try:
            item = result_item(c, await runner.call(run), s.max_result_bytes)
        except Exception as exc:
            item = failure_item(c, exc, s)
        finally:
            set_current(None)
        if isinstance(item, sc.Success) and runner.stopped(run):
            item = sc.Success.of(c, "cancelled", "cancelled by request")
        verdict: str
        if isinstance(item, sc.Success):
            call = sc.complete_call(qk, WORKER_ID, [item], s.events_maxlen, s.result_ttl_s)
            stored = sc.parse_complete(self._scripts.run(call))[0]
            verdict = item.status if stored else "stale"
        else:
            call = sc.fail_call(qk, WORKER_ID, [item], s.events_maxlen, s.dlq_ttl_s)
            verdict = sc.parse_verdicts(self._scripts.run(call))[0]
        await runner.notify(run, verdict, item)

    def _after_enqueue(self) -> None:
        if self.eager and not getattr(self._draining, "on", False):
            self.drain()

    async def _aafter_enqueue(self) -> None:
        if self.eager and not getattr(self._draining, "on", False):
            await self.adrain()


def _blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from sync code, also when called from inside an event loop (then
    on a loop of its own in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as helper:
        return helper.submit(asyncio.run, coro).result()


class _Bound:
    """What both test clients add: their TestQueue, and every enqueue sent through ``_send``
    (where eager mode runs it), never the single-task call."""

    def __init__(self, tq: TestQueue, **kw: Any) -> None:
        super().__init__(**kw)
        self._tq = tq

    def _single(self, queue: str, task: sc.NewTask) -> None:
        return None


class _TestClient(_Bound, Client):
    def _send(self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int) -> list[TaskHandle]:
        out = super()._send(by_queue, n)
        self._tq._after_enqueue()
        return out

    def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        h = super().enqueue_workflow(flow)
        self._tq._after_enqueue()
        return h


class _TestAsyncClient(_Bound, AsyncClient):
    async def _send(
        self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int
    ) -> list[TaskHandle]:
        out = await super()._send(by_queue, n)
        await self._tq._aafter_enqueue()
        return out

    async def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        h = await super().enqueue_workflow(flow)
        await self._tq._aafter_enqueue()
        return h
