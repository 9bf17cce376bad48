"""The client SDK: :class:`AsyncClient` and the blocking :class:`Client`, with the same methods.

Both are thin: validation lives in :mod:`dtq.requests`, the atomic transitions in the Lua
scripts (:mod:`dtq.scripts`). Every Redis connection error surfaces as
:class:`dtq.RedisUnavailable` with one line of text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Unpack, overload

import redis
import redis.asyncio as aredis

from dtq import partitions
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.clientbase import (
    _BLIPS,
    _REFUSED,
    BULK_FIRST,
    BULK_PART,
    CANCEL_REASON,
    REGISTER_EVERY_S,
    Hooked,
    P,
    Pipelined,
    R,
    ResultWait,
    Steps,
    T,
    TaskScan,
    _Base,
    _refused,
    _resend_delay,
    _unavailable,
    cancel_channel,
)
from dtq.cluster import ascan_tasks, scan_tasks
from dtq.coalesce import Coalescer, SyncCoalescer
from dtq.connection import async_redis, sync_redis
from dtq.donewait import DoneWaits, SyncDoneWaits
from dtq.errors import RedisUnavailable
from dtq.groupops import AsyncGroups, SyncGroups
from dtq.middleware import before_enqueue_async, before_enqueue_sync
from dtq.models import TaskHandle, TaskInfo
from dtq.requests import EnqueueOptions, TaskDefaults
from dtq.settings import Settings
from dtq.task import Task

if TYPE_CHECKING:
    from dtq.app import App
    from dtq.cancellation import CancelSummary

# Re-exported: imported from here before the shared part moved to dtq.clientbase.
__all__ = [
    "BULK_FIRST",
    "BULK_PART",
    "CANCEL_REASON",
    "REGISTER_EVERY_S",
    "AsyncClient",
    "Client",
    "cancel_channel",
]


class AsyncClient(AsyncGroups, _Base):
    """asyncio client. ``async with AsyncClient(url) as c: ...`` closes its connections."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        app: App | None = None,
        redis_client: aredis.Redis | None = None,
    ) -> None:
        super().__init__(url, settings, app)
        self.redis: aredis.Redis = redis_client or sc.hiredis_packing(
            async_redis(
                self.settings.redis_url,
                retries=self.settings.client_retries,
                wait_for_connection=True,  # (its coroutines may make any number of calls)
                check_eviction=True,  # (dtq.eviction: once per connection)
                decode_responses=True,
            ),
            fast_lane=self.settings.fast_lane,
        )
        self._scripts = sc.AsyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)
        self._done = DoneWaits(self.redis)  # every result() wait on one subscription
        # Single enqueues of one queue made while one is in flight go out together (coalesce.py).
        self._coalesced: Coalescer[str, sc.NewTask, TaskHandle] | None = (
            Coalescer(self._enqueue_batch) if self.settings.client_coalesce else None
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._coalesced is not None:
            await self._coalesced.drain()  # (the enqueues waiting for a batch get their answer)
        await self._done.close()
        await self.redis.aclose()

    async def _io(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _unavailable(exc) from None
        except _REFUSED as exc:
            raise _refused(exc) from None

    @overload
    async def enqueue(
        self, name: Task[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> TaskHandle[R]: ...

    @overload
    async def enqueue(
        self,
        name: str,
        /,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> TaskHandle[Any]: ...

    async def enqueue(self, name: Any, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue one task; one round trip. Returns its handle (``.id``).

        ``enqueue("reports.build", args=[...], kwargs={...}, queue=..., ...)`` by name, or
        ``enqueue(send_email, to=..., subject=...)`` through the task object: arguments checked
        by mypy against the function, the handle typed by its result, the task's declared
        defaults applied, options via ``send_email.options(delay=5)``.
        """
        if isinstance(name, Task):  # (it exists: no check whether a worker declares it)
            return await self._enqueue(**name.request(args, kwargs), defaults=name.defaults)
        h = await self._enqueue(name, *args, **kwargs)
        if due := self._undeclared(((h, name),)):  # once per DECLARED_EVERY_S, not per task
            await self._warn_undeclared(due)
        return h

    async def _enqueue(
        self,
        name: str,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        defaults: TaskDefaults | None = None,
        **options: Any,
    ) -> TaskHandle:
        """Enqueue one task; one round trip. Returns its handle (``.id``). ``options`` are
        :class:`EnqueueOptions` (build_task's keywords)."""
        mw = self._mw()
        d = defaults or self._defaults(name)
        if mw is None:
            q, task = self._built(name, args, kwargs, d, options)
        else:
            req = self._request(name, args, kwargs, options, d)
            await before_enqueue_async(mw, req)
            q, task = self._build(req, d)
        co = self._coalesced
        if co is None or co.sending():  # (sending: made inside a send, dtq.testing's eager)
            return await self._enqueue_one(q, task)
        if co.busy(q):  # an enqueue of q is in flight: this one goes in the batch after it
            return await co.wait(q, task)
        token = co.begin(q)
        try:
            return await self._enqueue_one(q, task)
        finally:
            co.end(q, token)

    async def _enqueue_one(self, q: str, task: sc.NewTask) -> TaskHandle:
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return (await self._send({q: [(0, task)]}, 1))[0]
        # The short path (see Client.enqueue).
        return self._handle(q, await self._io(lambda: self._scripts.run(call)))

    async def _enqueue_batch(self, queue: str, tasks: Sequence[sc.NewTask]) -> list[TaskHandle]:
        """The tasks of concurrent enqueues that waited for one in flight: one bulk call."""
        return await self._send({queue: list(enumerate(tasks))}, len(tasks))

    async def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Enqueue many tasks: one script call per queue, or parts of ``BULK_PART`` streamed
        over one connection for a bigger batch (Redis runs one part while the next is encoded).

        Each item is a dict of :meth:`enqueue`'s fields. Either every item is valid and all
        are sent, or a bad item raises before anything is sent. A connection lost in
        mid-stream raises :class:`dtq.RedisUnavailable`; parts Redis already ran stay enqueued.
        """
        by_queue, n = await self._drive(self._grouped_steps(items))
        hs = await self._send(by_queue, n)
        if due := self._undeclared(self._named(by_queue, hs)):
            await self._warn_undeclared(due)
        return hs

    async def _warn_undeclared(self, due: dict[tuple[str, str], str]) -> None:
        """Warn once about each name of ``due`` no live worker declares (see _Base). A Redis
        that cannot answer skips the check until the next period: the enqueue went through."""
        with contextlib.suppress(RedisUnavailable, redis.RedisError):
            self._warn(await self._drive(self._declared_steps(due)))

    async def _send(
        self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int
    ) -> list[TaskHandle]:
        out: list[TaskHandle | None] = [None] * n
        if not by_queue:
            return []
        plan = self._plan(by_queue)

        def place(k: int, raw: Any) -> None:
            self._place(out, plan[k][0], plan[k][1], raw)

        async def go() -> None:
            new = self._unregistered(by_queue)
            if new:  # once per queue and client: the registry lists the queues for operators
                await partitions.aregister(
                    self.redis, self.keys, self.settings.queue_partitions, new
                )
                self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
            if len(plan) == 1:  # one round trip
                place(0, await self._scripts.run(self._enqueue_call(*self._part(plan[0]))))
            else:  # streamed: Redis runs one part while the next is encoded
                await self._scripts.run_many(
                    (self._enqueue_call(*self._part(p)) for p in plan), place
                )

        # A streamed batch cut by a blip is sent again whole (redis-py re-sends single calls):
        # every task keeps its id, and enqueue.lua answers the parts that ran with their tasks.
        async def send() -> None:
            attempt = 0
            while True:
                try:
                    return await go()
                except _BLIPS:
                    if len(plan) == 1 or attempt >= self.settings.client_retries:
                        raise
                await asyncio.sleep(_resend_delay(attempt))
                attempt += 1

        await self._io(send)
        return [h for h in out if h is not None]

    async def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        """Enqueue a workflow (``chain``/``group``/``chord``) in one atomic call; every step
        is validated and encoded first (after ``before_enqueue`` middleware saw each step).
        The handle's ``id`` is the workflow's id."""
        reqs = await self._drive(self._flow_request_steps(flow))
        p, call, away = self._flow_plan(flow, reqs)
        return self._flow_handle(p, await self._drive(self._workflow_steps(p, call, away)))

    async def _drive(self, steps: Steps[T]) -> T:
        """Do a shared request's I/O (see _Base._get_steps)."""
        reply: Any = None
        try:
            while True:
                reply = await self._io(partial(self._step, steps.send(reply)))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _step(self, step: Any) -> Any:
        if isinstance(step, sc.Call):
            return await self._scripts.run(step)
        if isinstance(step, Hooked):
            return await before_enqueue_async(step.hooks, step.req)
        if isinstance(step, TaskScan):
            return await ascan_tasks(self.redis, step.qk, step.cursor, step.count)
        if isinstance(step, Pipelined):
            async with self.redis.pipeline(transaction=False) as pipe:
                for call in step.calls:
                    await self._scripts.run(call, pipe)
                return await pipe.execute()
        return await step(self.redis)

    async def get(self, task_id: str) -> TaskInfo:
        """The task's record; raises :class:`dtq.UnknownTask` if there is none. For a
        workflow id: the flow's status, result or error, and its ``steps`` and ``tree``."""
        return await self._drive(self._get_steps(task_id))

    @overload
    async def result(self, task_id: TaskHandle[R], timeout: float | None = None) -> R: ...

    @overload
    async def result(self, task_id: str, timeout: float | None = None) -> Any: ...

    async def result(self, task_id: str | TaskHandle[Any], timeout: float | None = None) -> Any:
        """Wait until the task ends; return its result or raise :class:`dtq.TaskFailed`.

        Waits on a pub/sub announcement (no polling); raises TimeoutError after ``timeout``.
        Given a handle typed by its task's result, mypy knows the result's type.
        """
        wait, woken = ResultWait(self.keys, task_id, timeout), None  # (woken: subscribed)
        try:
            while True:
                try:
                    if woken is None:  # (one subscription for all waits)
                        woken = await self._io(lambda: self._done.add(wait.channel))
                    woken.clear()  # (an announcement from here on is not missed: read after it)
                    info = await self.get(wait.task_id)
                except RedisUnavailable as exc:  # Redis away: read again until the deadline
                    await asyncio.sleep(wait.pause(exc))
                    continue
                if info.status.terminal:
                    return self._typed_outcome(info) if wait.typed else self._outcome(info)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), wait.left(info))
        finally:
            if woken is not None:
                await self._done.remove(wait.channel, woken)

    async def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task: True when it was cancelled or a running task was asked to stop.
        A workflow: its waiting steps never start, its started ones are cancelled as tasks."""
        return await self._drive(self._cancel_steps(task_id, reason))

    async def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.cancellation)."""
        from dtq.cancellation import acancel_many

        return await self._io(lambda: acancel_many(self, queue, name, reason))


class Client(SyncGroups, _Base):
    """Blocking client with the same methods as :class:`AsyncClient`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        app: App | None = None,
        redis_client: redis.Redis | None = None,
    ) -> None:
        super().__init__(url, settings, app)
        # (A cluster client connects here already: unreachable, that is RedisUnavailable.)
        self.redis: redis.Redis = redis_client or self._io(
            lambda: sync_redis(
                self.settings.redis_url,
                retries=self.settings.client_retries,
                wait_for_connection=True,  # (its threads may make any number of calls)
                check_eviction=True,  # (dtq.eviction: once per connection)
                decode_responses=True,
            )
        )
        self._scripts = sc.SyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)
        # Every result() wait of every thread on one subscription, read by one thread.
        self._done = SyncDoneWaits(self.redis, self.keys.wake_channel)
        # Single enqueues of one queue made while another thread's is in flight go out
        # together (coalesce.py).
        self._coalesced: SyncCoalescer[str, sc.NewTask, TaskHandle] | None = (
            SyncCoalescer(self._enqueue_batch) if self.settings.client_coalesce else None
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._done.close()
        self.redis.close()

    def _io(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _unavailable(exc) from None
        except _REFUSED as exc:
            raise _refused(exc) from None

    @overload
    def enqueue(self, name: Task[P, R], /, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]: ...

    @overload
    def enqueue(
        self,
        name: str,
        /,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> TaskHandle[Any]: ...

    def enqueue(self, name: Any, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue one task; one round trip. Returns its handle (``.id``).

        ``enqueue("reports.build", args=[...], kwargs={...}, queue=..., ...)`` by name, or
        ``enqueue(send_email, to=..., subject=...)`` through the task object: arguments checked
        by mypy against the function, the handle typed by its result, the task's declared
        defaults applied, options via ``send_email.options(delay=5)``.
        """
        if isinstance(name, Task):  # (it exists: no check whether a worker declares it)
            return self._enqueue(**name.request(args, kwargs), defaults=name.defaults)
        h = self._enqueue(name, *args, **kwargs)
        if due := self._undeclared(((h, name),)):  # once per DECLARED_EVERY_S, not per task
            self._warn_undeclared(due)
        return h

    def _enqueue(
        self,
        name: str,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        defaults: TaskDefaults | None = None,
        **options: Any,
    ) -> TaskHandle:
        """Enqueue one task; one round trip. Returns its handle (``.id``). ``options`` are
        :class:`EnqueueOptions` (build_task's keywords)."""
        mw = self._mw()
        d = defaults or self._defaults(name)
        if mw is None:
            q, task = self._built(name, args, kwargs, d, options)
        else:
            req = self._request(name, args, kwargs, options, d)
            before_enqueue_sync(mw, req)
            q, task = self._build(req, d)
        co = self._coalesced
        if co is None:
            return self._enqueue_one(q, task)
        # Another thread's enqueue of q in flight: this one goes in the batch after it.
        return co.call(q, task, partial(self._enqueue_one, q, task))

    def _enqueue_one(self, q: str, task: sc.NewTask) -> TaskHandle:
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return self._send({q: [(0, task)]}, 1)[0]
        # The short path: one script call, without the batch plan, closures and handle list of
        # _send (a sixth of a single enqueue's client time).
        return self._handle(q, self._io(lambda: self._scripts.run(call)))

    def _enqueue_batch(self, queue: str, tasks: Sequence[sc.NewTask]) -> list[TaskHandle]:
        """The tasks of concurrent enqueues that waited for one in flight: one bulk call."""
        return self._send({queue: list(enumerate(tasks))}, len(tasks))

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Enqueue many tasks; see :meth:`AsyncClient.enqueue_many`."""
        by_queue, n = self._drive(self._grouped_steps(items))
        hs = self._send(by_queue, n)
        if due := self._undeclared(self._named(by_queue, hs)):
            self._warn_undeclared(due)
        return hs

    def _warn_undeclared(self, due: dict[tuple[str, str], str]) -> None:
        """See :meth:`AsyncClient._warn_undeclared`."""
        with contextlib.suppress(RedisUnavailable, redis.RedisError):
            self._warn(self._drive(self._declared_steps(due)))

    def _send(self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int) -> list[TaskHandle]:
        out: list[TaskHandle | None] = [None] * n
        if not by_queue:
            return []
        plan = self._plan(by_queue)

        def place(k: int, raw: Any) -> None:
            self._place(out, plan[k][0], plan[k][1], raw)

        def go() -> None:
            new = self._unregistered(by_queue)
            if new:  # once per queue and client: the registry lists the queues for operators
                partitions.register(self.redis, self.keys, self.settings.queue_partitions, new)
                self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
            if len(plan) == 1:  # one round trip
                place(0, self._scripts.run(self._enqueue_call(*self._part(plan[0]))))
            else:
                # Streamed over the lane: Redis runs one part while the client encodes the next
                # and makes the handles of the one before (every item was validated first).
                self._scripts.run_many((self._enqueue_call(*self._part(p)) for p in plan), place)

        def send() -> None:  # a streamed batch cut by a blip is sent again whole (AsyncClient)
            attempt = 0
            while True:
                try:
                    return go()
                except _BLIPS:
                    if len(plan) == 1 or attempt >= self.settings.client_retries:
                        raise
                time.sleep(_resend_delay(attempt))
                attempt += 1

        self._io(send)
        return [h for h in out if h is not None]

    def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        """Enqueue a workflow; see :meth:`AsyncClient.enqueue_workflow`."""
        reqs = self._drive(self._flow_request_steps(flow))
        p, call, away = self._flow_plan(flow, reqs)
        return self._flow_handle(p, self._drive(self._workflow_steps(p, call, away)))

    def _drive(self, steps: Steps[T]) -> T:
        """Do a shared request's I/O (see _Base._get_steps)."""
        reply: Any = None
        try:
            while True:
                reply = self._io(partial(self._step, steps.send(reply)))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _step(self, step: Any) -> Any:
        if isinstance(step, sc.Call):
            return self._scripts.run(step)
        if isinstance(step, Hooked):
            return before_enqueue_sync(step.hooks, step.req)
        if isinstance(step, TaskScan):
            return scan_tasks(self.redis, step.qk, step.cursor, step.count)
        if isinstance(step, Pipelined):
            with self.redis.pipeline(transaction=False) as pipe:
                for call in step.calls:
                    self._scripts.run(call, pipe)
                return pipe.execute()
        return step(self.redis)

    def get(self, task_id: str) -> TaskInfo:
        """The task's record; raises :class:`dtq.UnknownTask` if there is none (a workflow:
        see :meth:`AsyncClient.get`)."""
        return self._drive(self._get_steps(task_id))

    @overload
    def result(self, task_id: TaskHandle[R], timeout: float | None = None) -> R: ...

    @overload
    def result(self, task_id: str, timeout: float | None = None) -> Any: ...

    def result(self, task_id: str | TaskHandle[Any], timeout: float | None = None) -> Any:
        """Wait until the task ends; return its result or raise :class:`dtq.TaskFailed`."""
        wait, woken = ResultWait(self.keys, task_id, timeout), None  # (woken: subscribed)
        try:
            while True:
                try:
                    if woken is None:  # (one subscription for all waits)
                        woken = self._io(lambda: self._done.add(wait.channel))
                    woken.clear()  # (an announcement from here on is not missed: read after it)
                    info = self.get(wait.task_id)
                except RedisUnavailable as exc:  # Redis away: read again until the deadline
                    time.sleep(wait.pause(exc))
                    continue
                if info.status.terminal:
                    return self._typed_outcome(info) if wait.typed else self._outcome(info)
                woken.wait(wait.left(info))
        finally:
            if woken is not None:
                self._done.remove(wait.channel, woken)

    def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task or a workflow; see :meth:`AsyncClient.cancel`."""
        return self._drive(self._cancel_steps(task_id, reason))

    def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.cancellation)."""
        from dtq.cancellation import cancel_many

        return self._io(lambda: cancel_many(self, queue, name, reason))
