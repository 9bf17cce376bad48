"""The client SDK: :class:`AsyncClient` and the blocking :class:`Client`, with the same methods.

Both are thin: validation lives in :mod:`dtq.sdk.requests`, the atomic transitions in the Lua
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

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.errors import RedisUnavailable
from dtq.middleware import before_enqueue_async, before_enqueue_sync
from dtq.models import TaskHandle, TaskInfo
from dtq.schedules import ops as sched
from dtq.schedules.model import Schedule, ScheduleInfo
from dtq.sdk.cancellation import CancelSummary, cancel_many_steps
from dtq.sdk.clientbase import (
    CANCEL_REASON,
    REFUSED,
    ClientBase,
    Hooked,
    P,
    Pause,
    Pipelined,
    R,
    Steps,
    Streamed,
    T,
    TaskScan,
    refused,
    unavailable,
)
from dtq.sdk.coalesce import Coalescer, SyncCoalescer
from dtq.sdk.donewait import DoneWaits, SyncDoneWaits
from dtq.sdk.groupops import AsyncGroups, SyncGroups
from dtq.sdk.requests import EnqueueOptions, TaskDefaults
from dtq.settings import Settings
from dtq.store.cluster import ascan_tasks, scan_tasks
from dtq.store.connection import async_redis, sync_redis
from dtq.task import Task

if TYPE_CHECKING:
    from dtq.app import App

__all__ = ["AsyncClient", "Client"]


class AsyncClient(AsyncGroups, ClientBase):
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
                check_eviction=True,  # (dtq.store.eviction: once per connection)
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
            raise unavailable(exc) from None
        except REFUSED as exc:
            raise refused(exc) from None

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
        """Warn once about each name of ``due`` no live worker declares (see ClientBase). A Redis
        that cannot answer skips the check until the next period: the enqueue went through."""
        with contextlib.suppress(RedisUnavailable, redis.RedisError):
            self._warn(await self._drive(self._declared_steps(due)))

    async def _send(
        self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int
    ) -> list[TaskHandle]:
        """Enqueue the tasks of ``by_queue`` (see ClientBase._send_steps); dtq.testing's hook."""
        return await self._drive(self._send_steps(by_queue, n))

    async def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        """Enqueue a workflow (``chain``/``group``/``chord``) in one atomic call; every step
        is validated and encoded first (after ``before_enqueue`` middleware saw each step).
        The handle's ``id`` is the workflow's id."""
        reqs = await self._drive(self._flow_request_steps(flow))
        p, call, away = self._flow_plan(flow, reqs)
        return self._flow_handle(p, await self._drive(self._workflow_steps(p, call, away)))

    async def _drive(self, steps: Steps[T]) -> T:
        """Do a shared request's I/O (see ClientBase._get_steps): each step's reply is sent
        back, its error (RedisUnavailable for Redis's) raised at the step."""
        go: Callable[[Any], Any] = steps.send
        arg: Any = None
        while True:
            try:
                step = go(arg)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                arg, go = await self._io(partial(self._step, step)), steps.send
            except BaseException as exc:  # (also a cancel: a wait's finally unsubscribes)
                arg, go = exc, steps.throw

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
        if isinstance(step, Streamed):
            return await self._scripts.run_many(step.calls, step.each)
        if isinstance(step, Pause):
            if step.woken is None:
                return await asyncio.sleep(step.seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(step.woken.wait(), step.seconds)
            return None
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
        return await self._drive(self._result_steps(task_id, timeout))

    async def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task: True when it was cancelled or a running task was asked to stop.
        A workflow: its waiting steps never start, its started ones are cancelled as tasks."""
        return await self._drive(self._cancel_steps(task_id, reason))

    async def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.sdk.cancellation)."""
        return await self._drive(cancel_many_steps(self, queue, name, reason))

    async def list_schedules(self, queue: str | None = None) -> list[ScheduleInfo]:
        """Every stored schedule (of one queue, or of all known queues), soonest fire first."""
        return await self._drive(sched.list_steps(self.keys, queue))

    async def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        """Store (create or replace) a schedule at run time; it fires from its next fire time on.

        A schedule with the same queue and name is replaced. Returns the stored schedule.
        """
        return await self._drive(sched.add_steps(self.keys, schedule))

    async def remove_schedule(self, name: str, queue: str = "default") -> bool:
        """Delete a schedule; True if it existed. Tasks it already enqueued are not touched.

        A schedule declared in code comes back while a worker running that code consumes the
        queue (it stores its schedules every 30 s): remove it from the code instead.
        """
        return await self._drive(sched.remove_steps(self.keys, name, queue))

    async def set_schedule_enabled(
        self, name: str, queue: str, enabled: bool
    ) -> tuple[bool, ScheduleInfo]:
        """Disable a schedule (it stops firing, its definition kept) or enable it again (it
        fires from its next fire time after now); returns whether it changed and the schedule.

        One atomic ``ZADD``: disabling sets its next fire to +inf (XX: only a stored schedule);
        enabling sets the next fire time only where it is lower (LT), so an enabled schedule
        keeps its own.
        """
        return await self._drive(sched.set_enabled_steps(self.keys, name, queue, enabled))

    async def run_schedule_now(self, name: str, queue: str = "default") -> str:
        """Enqueue the schedule's task now, as a fire would (its metadata names the schedule);
        the schedule's own fire times do not move. Returns the task id."""
        s = await self._drive(sched.stored_steps(self.keys, name, queue))
        return (await self.enqueue(s.task, **sched.run_now_request(s))).id


class Client(SyncGroups, ClientBase):
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
                check_eviction=True,  # (dtq.store.eviction: once per connection)
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
            raise unavailable(exc) from None
        except REFUSED as exc:
            raise refused(exc) from None

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
        """See :meth:`AsyncClient._send`."""
        return self._drive(self._send_steps(by_queue, n))

    def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        """Enqueue a workflow; see :meth:`AsyncClient.enqueue_workflow`."""
        reqs = self._drive(self._flow_request_steps(flow))
        p, call, away = self._flow_plan(flow, reqs)
        return self._flow_handle(p, self._drive(self._workflow_steps(p, call, away)))

    def _drive(self, steps: Steps[T]) -> T:
        """See :meth:`AsyncClient._drive`."""
        go: Callable[[Any], Any] = steps.send
        arg: Any = None
        while True:
            try:
                step = go(arg)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                arg, go = self._io(partial(self._step, step)), steps.send
            except BaseException as exc:
                arg, go = exc, steps.throw

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
        if isinstance(step, Streamed):
            return self._scripts.run_many(step.calls, step.each)
        if isinstance(step, Pause):
            return time.sleep(step.seconds) if step.woken is None else step.woken.wait(step.seconds)
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
        return self._drive(self._result_steps(task_id, timeout))

    def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task or a workflow; see :meth:`AsyncClient.cancel`."""
        return self._drive(self._cancel_steps(task_id, reason))

    def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.sdk.cancellation)."""
        return self._drive(cancel_many_steps(self, queue, name, reason))

    def list_schedules(self, queue: str | None = None) -> list[ScheduleInfo]:
        """Every stored schedule; see :meth:`AsyncClient.list_schedules`."""
        return self._drive(sched.list_steps(self.keys, queue))

    def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        """Store a schedule at run time; see :meth:`AsyncClient.add_schedule`."""
        return self._drive(sched.add_steps(self.keys, schedule))

    def remove_schedule(self, name: str, queue: str = "default") -> bool:
        """Delete a schedule; see :meth:`AsyncClient.remove_schedule`."""
        return self._drive(sched.remove_steps(self.keys, name, queue))

    def set_schedule_enabled(
        self, name: str, queue: str, enabled: bool
    ) -> tuple[bool, ScheduleInfo]:
        """Disable or enable a schedule; see :meth:`AsyncClient.set_schedule_enabled`."""
        return self._drive(sched.set_enabled_steps(self.keys, name, queue, enabled))

    def run_schedule_now(self, name: str, queue: str = "default") -> str:
        """Enqueue a schedule's task now; see :meth:`AsyncClient.run_schedule_now`."""
        s = self._drive(sched.stored_steps(self.keys, name, queue))
        return self.enqueue(s.task, **sched.run_now_request(s)).id
