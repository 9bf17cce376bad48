"""The client SDK: :class:`AsyncClient` and the blocking :class:`Client`, with the same methods.

Both are thin: validation lives in :mod:`dtq.requests`, the atomic transitions in the Lua
scripts (:mod:`dtq.scripts`). Every Redis connection error surfaces as
:class:`dtq.RedisUnavailable` with one line of text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import redis
import redis.asyncio as aredis

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.app import App, Task
from dtq.connection import RETRY_BASE_S, RETRY_CAP_S, async_redis, sync_redis
from dtq.declared import pending as pending_declared
from dtq.errors import (
    InvalidRequest,
    RedisUnavailable,
    SerializationError,
    TaskFailed,
    UnknownTask,
)
from dtq.eviction import is_oom, out_of_memory_message
from dtq.keys import Keys, is_flow_id, split_task_id
from dtq.middleware import EnqueueRequest, Hooks, before_enqueue_async, before_enqueue_sync
from dtq.models import TaskHandle, TaskInfo, TaskStatus
from dtq.requests import ENQUEUE_FIELDS, TaskDefaults, build_task, check_fields
from dtq.settings import Settings, checked_redis_url, load_settings

if TYPE_CHECKING:
    from dtq.cancellation import CancelSummary

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_STATUS = {s.value: s for s in TaskStatus}
# Tasks per enqueue.lua call when a blocking client's bulk enqueue is sent in parts. The first
# part is small, so Redis starts while the client still encodes (it idles until a part is sent).
BULK_PART = 250
BULK_FIRST = 32


def _bulk_parts(n: int) -> list[tuple[int, int]]:
    """(start, end) of each part of an ``n``-task bulk enqueue."""
    first = min(n, BULK_FIRST)
    return [(0, first)] + [(i, min(n, i + BULK_PART)) for i in range(first, n, BULK_PART)]


CANCEL_REASON = "cancelled by request"
# How long a client trusts its own registration of a queue in P:queues (see _Base).
REGISTER_EVERY_S = 60.0


def cancel_channel(keys: Keys) -> str:
    """Pub/sub channel on which workers hear cancel requests for running tasks."""
    return f"{keys.prefix}:cancel"


def _unavailable(exc: Exception) -> RedisUnavailable:
    return RedisUnavailable(f"Redis unreachable: {exc}")


_BLIPS = (redis.ConnectionError, redis.TimeoutError)
# Error replies of a Redis that cannot take writes now: the call did not take effect (a
# streamed bulk enqueue: the parts before it did). Raised as RedisUnavailable, a DtqError.
_REFUSED = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


def _refused(exc: Exception) -> RedisUnavailable:
    if is_oom(exc):
        return RedisUnavailable(out_of_memory_message(exc))
    return RedisUnavailable(f"Redis refused the write: {exc}")


def _resend_delay(attempt: int) -> float:
    """Jittered wait before re-sending a streamed bulk enqueue (as redis-py's own re-sends)."""
    return random.uniform(0, min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt))


class _Base:
    def __init__(self, url: str | None, settings: Settings | None, app: App | None) -> None:
        if settings is None:
            settings = app.settings if app is not None else load_settings()
        if url is not None:  # (model_copy does not validate: check it here)
            settings = settings.model_copy(update={"redis_url": checked_redis_url(url)})
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.app = app
        # Queues this client has added to the registry set (P:queues), each until when: later
        # enqueues to them skip the SADD and so need no pipeline. The registration is renewed
        # after REGISTER_EVERY_S, so a keyspace flushed meanwhile (FLUSHALL, a restore) lists
        # the queue again.
        self._registered: dict[str, float] = {}

    def _defaults(self, name: str) -> TaskDefaults | None:
        if self.app is None or not isinstance(name, str):  # a bad name: build_task says so
            return None
        return self.app.defaults_for(name)

    # --- middleware (dtq.middleware): before_enqueue sees each request before it is built ---

    def _mw(self) -> Hooks | None:
        app = self.app
        if app is None or app.no_enqueue_hooks:  # the usual case: no call, no lookup
            return None
        hooks = app.hooks()
        return hooks if hooks is not None and hooks.before_enqueue else None

    def _request(
        self,
        name: str,
        args: Any,
        kwargs: Mapping[str, Any] | None,
        options: dict[str, Any],
        defaults: TaskDefaults | None = None,
    ) -> EnqueueRequest:
        opts = {k: v for k, v in options.items() if v is not None}
        metadata, queue = opts.pop("metadata", None), opts.pop("queue", None)
        d = defaults or self._defaults(name)
        q = queue or (d.queue if d is not None else "default")
        return EnqueueRequest(name, args, kwargs, q, opts, dict(metadata or {}), {})

    def _requests(self, items: Iterable[Mapping[str, Any]]) -> list[EnqueueRequest]:
        reqs = []
        for item in items:
            if "name" not in item or not item.keys() <= ENQUEUE_FIELDS:
                check_fields(item)
            opts = {k: v for k, v in item.items() if k not in ("name", "args", "kwargs")}
            reqs.append(self._request(item["name"], item.get("args"), item.get("kwargs"), opts))
        return reqs

    def _build(
        self, req: EnqueueRequest, defaults: TaskDefaults | None = None
    ) -> tuple[str, sc.NewTask]:
        return build_task(
            self.settings, req.name, req.args, req.kwargs,
            defaults=defaults or self._defaults(req.name),
            queue=req.queue, metadata=req.metadata or None, headers=req.headers or None,
            **req.options,
        )  # fmt: skip

    def _group_requests(
        self, reqs: list[EnqueueRequest]
    ) -> tuple[dict[str, list[tuple[int, sc.NewTask]]], int]:
        by_queue: dict[str, list[tuple[int, sc.NewTask]]] = {}
        for i, req in enumerate(reqs):
            q, task = self._build(req)
            by_queue.setdefault(q, []).append((i, task))
        return by_queue, len(reqs)

    def _group(
        self, items: Iterable[Mapping[str, Any]]
    ) -> tuple[dict[str, list[tuple[int, sc.NewTask]]], int]:
        by_queue: dict[str, list[tuple[int, sc.NewTask]]] = {}
        settings = self.settings
        n = 0
        for i, item in enumerate(items):
            try:
                plain = "name" in item and item.keys() <= ENQUEUE_FIELDS
            except (TypeError, AttributeError):  # not a mapping
                raise InvalidRequest(f"item {i} is not a dict of enqueue fields") from None
            if not plain:
                check_fields(item)  # says which field is wrong
            # An item's fields are build_task's keyword arguments (checked just above).
            q, task = build_task(settings, defaults=self._defaults(item["name"]), **item)
            group = by_queue.get(q)
            if group is None:
                group = by_queue[q] = []
            group.append((i, task))
            n = i + 1
        return by_queue, n

    @staticmethod
    def _place(
        out: list[TaskHandle | None], queue: str, tasks: list[tuple[int, sc.NewTask]], raw: Any
    ) -> None:
        """Put the handles of enqueue.lua's reply (3 fields per task) at their items' places."""
        for j, (i, _) in enumerate(tasks):
            out[i] = _Base._handle(queue, raw, 3 * j)

    def _unregistered(self, queues: Iterable[str]) -> list[str]:
        """Those of ``queues`` this client has not registered lately."""
        now = time.monotonic()
        return [q for q in queues if self._registered.get(q, 0.0) < now]

    def _single(self, queue: str, task: sc.NewTask) -> sc.Call | None:
        """The script call enqueueing ``task`` alone, if this client registered ``queue``."""
        until = self._registered.get(queue)
        if until is None or until < time.monotonic():
            return None
        return sc.enqueue_one_call(self.keys.prefix, queue, task, self.settings.events_maxlen)

    @staticmethod
    def _handle(queue: str, raw: Any, b: int = 0) -> TaskHandle:
        """The handle of the task whose 3 fields of enqueue.lua's reply start at ``raw[b]``."""
        tid, status = raw[b], raw[b + 1]
        if type(tid) is not str:
            tid, status = tid.decode(), status.decode()
        return TaskHandle(f"{queue}:{tid}", queue, _STATUS[status], int(raw[b + 2]) == 1)

    @staticmethod
    def _plan(
        by_queue: dict[str, list[tuple[int, sc.NewTask]]],
    ) -> list[tuple[str, list[tuple[int, sc.NewTask]]]]:
        """The enqueue.lua calls of a batch: per queue, its tasks in parts (one when small)."""
        plan = []
        for q, tasks in by_queue.items():
            if len(tasks) <= BULK_PART:
                plan.append((q, tasks))
            else:
                plan.extend((q, tasks[a:b]) for a, b in _bulk_parts(len(tasks)))
        return plan

    @staticmethod
    def _part(p: tuple[str, list[tuple[int, sc.NewTask]]]) -> tuple[str, list[sc.NewTask]]:
        return p[0], [t for _, t in p[1]]

    def _enqueue_call(self, queue: str, tasks: list[sc.NewTask]) -> sc.Call:
        return sc.enqueue_call(self.keys.queue(queue), tasks, self.settings.events_maxlen)

    def _cancel_call(self, task_id: str, reason: str) -> sc.Call:
        queue, tid = split_task_id(task_id)
        return sc.cancel_call(
            self.keys.queue(queue),
            tid,
            events_maxlen=self.settings.events_maxlen,
            ttl_s=self.settings.result_ttl_s,
            hint_channel=cancel_channel(self.keys),
            reason=reason,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )

    @staticmethod
    def _info(task_id: str, rec: dict[str, str], declared: str | None = None) -> TaskInfo:
        if not rec:
            raise UnknownTask(f"no task {task_id} (never enqueued, or its record expired)")
        queue, _ = split_task_id(task_id)
        return TaskInfo.from_record(task_id, queue, rec, declared)

    def _flow_plan(
        self, flow: wf.Flow, reqs: list[EnqueueRequest] | None = None
    ) -> tuple[wf.Plan, sc.Call, list[tuple[str, str]]]:
        p = wf.plan(flow, self.settings, self._defaults, requests=reqs)
        call, away = wf.enqueue_call(
            self.keys, p, self.settings.events_maxlen, self.settings.max_payload_bytes
        )
        return p, call, away

    def _step_requests(self, flow: wf.Flow) -> list[EnqueueRequest]:
        """Each step's request, for before_enqueue middleware (then built from it)."""
        return [
            self._request(s.name, list(s.args), s.kwargs, dict(s.options), s.defaults)
            for s in wf.sigs(flow)
        ]

    def _flow_handle(self, p: wf.Plan, raw: Any) -> TaskHandle:
        return TaskHandle(p.id, p.home, TaskStatus.QUEUED, int(raw[1]) == 1)

    def _put_calls(self, away: list[tuple[str, str]]) -> list[sc.Call]:
        """The moves of a new flow's first steps on other queues (idempotent: a worker moves
        them again from the outbox if this client did not)."""
        em = self.settings.events_maxlen
        return [wf.put_call(self.keys.queue(q), s, json.loads(s)[3], em) for q, s in away]

    def _flow_keys(self, task_id: str) -> tuple[str, str]:
        home, ftid = split_task_id(task_id)
        return self.keys.queue(home).flow(ftid), home

    def _flow_info(self, task_id: str, rec: dict[str, str], statuses: list[Any]) -> TaskInfo:
        if not rec:
            raise UnknownTask(f"no workflow {task_id} (never enqueued, or its record expired)")
        d = wf.flow_record(task_id, rec, statuses)
        info = TaskInfo.from_record(task_id, split_task_id(task_id)[0], d["rec"])
        return dataclasses.replace(info, steps=d["steps"], tree=d["tree"])

    def _step_keys(self, rec: dict[str, str]) -> list[str]:
        out = []
        for i in range(int(rec.get("n", 0))):
            q, tid = split_task_id(rec[f"q{i}"])
            out.append(self.keys.queue(q).task(tid))
        return out

    def _flow_cancel_call(self, task_id: str, reason: str) -> sc.Call:
        home, ftid = split_task_id(task_id)
        ttl = self.settings.result_ttl_s
        return wf.cancel_call(
            self.keys.queue(home), ftid, reason, ttl, self.settings.events_maxlen,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )  # fmt: skip

    def _tomb_call(self, step_id: str, reason: str) -> sc.Call:
        """flow_tomb.lua for a cancelled flow's step whose record does not exist yet."""
        q, tid = split_task_id(step_id)
        return wf.tomb_call(self.keys.queue(q), tid, reason, self.settings.result_ttl_s)

    @staticmethod
    def _outcome(info: TaskInfo) -> Any:
        if info.status == TaskStatus.SUCCEEDED:
            return info.result
        raise TaskFailed(info.id, info.status.value, info.error)

    def _typed_outcome(self, info: TaskInfo) -> Any:
        """The result of a task awaited through its handle: decoded to the task's return type
        when this client's app knows the task (docs/arguments.md), else as stored."""
        value = self._outcome(info)
        task = None if self.app is None else self.app.tasks.get(info.name)
        if task is None:
            return value
        try:
            return task.decode_result(value)
        except ValueError as exc:
            raise SerializationError(
                f"result of {info.id} cannot be read as {info.name}'s return type: {exc}"
            ) from None


class AsyncClient(_Base):
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
                decode_responses=True,
            ),
            fast_lane=self.settings.fast_lane,
        )
        self._scripts = sc.AsyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
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
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        eta: datetime | str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        expires: float | timedelta | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
        unique: bool | None = None,
    ) -> TaskHandle[Any]: ...

    async def enqueue(self, name: Any, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue one task; one round trip. Returns its handle (``.id``).

        ``enqueue("reports.build", args=[...], kwargs={...}, queue=..., ...)`` by name, or
        ``enqueue(send_email, to=..., subject=...)`` through the task object: arguments checked
        by mypy against the function, the handle typed by its result, the task's declared
        defaults applied, options via ``send_email.options(delay=5)``.
        """
        if isinstance(name, Task):
            return await self._enqueue(**name.request(args, kwargs), defaults=name.defaults)
        return await self._enqueue(name, *args, **kwargs)

    async def _enqueue(
        self,
        name: str,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        defaults: TaskDefaults | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        eta: datetime | str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        expires: float | timedelta | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
        unique: bool | None = None,
    ) -> TaskHandle:
        """Enqueue one task; one round trip. Returns its handle (``.id``)."""
        mw = self._mw()
        d = defaults or self._defaults(name)
        if mw is None:
            q, task = build_task(
                self.settings, name, args, kwargs, defaults=d, queue=queue,
                priority=priority, delay=delay, eta=eta, max_retries=max_retries,
                timeout=timeout, idempotency_key=idempotency_key, expires=expires,
                metadata=metadata, unique=unique,
            )  # fmt: skip
        else:
            req = self._request(name, args, kwargs, dict(
                queue=queue, priority=priority, delay=delay, eta=eta, max_retries=max_retries,
                timeout=timeout, idempotency_key=idempotency_key, expires=expires,
                metadata=metadata, unique=unique,
            ), d)  # fmt: skip
            await before_enqueue_async(mw, req)
            q, task = self._build(req, d)
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return (await self._send({q: [(0, task)]}, 1))[0]
        # The short path (see Client.enqueue).
        return self._handle(q, await self._io(lambda: self._scripts.run(call)))

    async def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Enqueue many tasks: one script call per queue, or parts of ``BULK_PART`` streamed
        over one connection for a bigger batch (Redis runs one part while the next is encoded).

        Each item is a dict of :meth:`enqueue`'s fields. Either every item is valid and all
        are sent, or a bad item raises before anything is sent. A connection lost in
        mid-stream raises :class:`dtq.RedisUnavailable`; parts Redis already ran stay enqueued.
        """
        mw = self._mw()
        if mw is None:
            by_queue, n = self._group(items)
        else:
            reqs = self._requests(items)
            for req in reqs:
                await before_enqueue_async(mw, req)
            by_queue, n = self._group_requests(reqs)
        return await self._send(by_queue, n)

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
                await self.redis.sadd(self.keys.queues, *new)
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
        mw, reqs = self._mw(), None
        if mw is not None:
            reqs = self._step_requests(flow)
            for req in reqs:
                await before_enqueue_async(mw, req)
        p, call, away = self._flow_plan(flow, reqs)

        async def go() -> Any:
            queues = {s.queue for s in p.steps}
            new = self._unregistered(queues)
            if new:
                await self.redis.sadd(self.keys.queues, *new)
                self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
            raw = await self._scripts.run(call)
            for c in self._put_calls(away):
                await self._scripts.run(c)
            return raw

        return self._flow_handle(p, await self._io(go))

    async def _get_flow(self, task_id: str) -> TaskInfo:
        fkey, _ = self._flow_keys(task_id)
        rec: Any = await self._io(lambda: self.redis.hgetall(fkey))
        statuses: list[Any] = []
        if rec:
            pipe = self.redis.pipeline(transaction=False)
            for k in self._step_keys(rec):
                pipe.hmget(k, "status", "name")
            statuses = await self._io(pipe.execute)
        return self._flow_info(task_id, rec, statuses)

    async def get(self, task_id: str) -> TaskInfo:
        """The task's record; raises :class:`dtq.UnknownTask` if there is none. For a
        workflow id: the flow's status, result or error, and its ``steps`` and ``tree``."""
        if is_flow_id(task_id):
            return await self._get_flow(task_id)
        queue, tid = split_task_id(task_id)
        qk = self.keys.queue(queue)
        rec: Any = await self._io(lambda: self.redis.hgetall(qk.task(tid)))
        decl: Any = None
        if pending_declared(rec):  # not claimed yet, some values left to the worker's declaration
            decl = await self._io(lambda: self.redis.hget(qk.decl, rec.get("name", "")))
        return self._info(task_id, rec, decl)

    @overload
    async def result(self, task_id: TaskHandle[R], timeout: float | None = None) -> R: ...

    @overload
    async def result(self, task_id: str, timeout: float | None = None) -> Any: ...

    async def result(self, task_id: str | TaskHandle[Any], timeout: float | None = None) -> Any:
        """Wait until the task ends; return its result or raise :class:`dtq.TaskFailed`.

        Waits on a pub/sub announcement (no polling); raises TimeoutError after ``timeout``.
        Given a handle typed by its task's result, mypy knows the result's type.
        """
        typed = not isinstance(task_id, str)  # a handle: its result decoded by return type
        if not isinstance(task_id, str):
            task_id = task_id.id
        queue, tid = split_task_id(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._subscribed(self.keys.queue(queue).done_channel(tid)) as ps:
            while True:
                info = await self.get(task_id)
                if info.status.terminal:
                    return self._typed_outcome(info) if typed else self._outcome(info)
                remaining = 5.0 if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"task {task_id} still {info.status.value}")
                wait = min(remaining, 5.0)
                await self._io(
                    partial(ps.get_message, ignore_subscribe_messages=True, timeout=wait)
                )

    @asynccontextmanager
    async def _subscribed(self, channel: str) -> AsyncIterator[Any]:
        ps = self.redis.pubsub()
        try:
            await self._io(lambda: ps.subscribe(channel))
            yield ps
        finally:
            await ps.aclose()  # type: ignore[no-untyped-call]

    async def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task: True when it was cancelled or a running task was asked to stop.
        A workflow: its waiting steps never start, its started ones are cancelled as tasks."""
        if is_flow_id(task_id):
            fc = self._flow_cancel_call(task_id, reason)  # (one nonce for all its re-sends)
            raw = await self._io(lambda: self._scripts.run(fc))
            if not raw or not raw[0]:
                raise UnknownTask(f"no workflow {task_id}")
            for step in raw[1:]:
                c = self._cancel_call(step, reason)
                res = sc.parse_cancel(await self._io(lambda c=c: self._scripts.run(c)))  # type: ignore[misc]
                if res.outcome == "missing":  # on its way to its queue: it never runs
                    t = self._tomb_call(step, reason)
                    await self._io(lambda t=t: self._scripts.run(t))  # type: ignore[misc]
            return bool(raw[0] in ("running", "failed"))
        call = self._cancel_call(task_id, reason)
        raw = await self._io(lambda: self._scripts.run(call))
        res = sc.parse_cancel(raw)
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return res.outcome in ("cancelled", "requested")

    async def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.cancellation)."""
        from dtq.cancellation import acancel_many

        return await self._io(lambda: acancel_many(self, queue, name, reason))


class Client(_Base):
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
                self.settings.redis_url, retries=self.settings.client_retries, decode_responses=True
            )
        )
        self._scripts = sc.SyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
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
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        eta: datetime | str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        expires: float | timedelta | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
        unique: bool | None = None,
    ) -> TaskHandle[Any]: ...

    def enqueue(self, name: Any, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue one task; one round trip. Returns its handle (``.id``).

        ``enqueue("reports.build", args=[...], kwargs={...}, queue=..., ...)`` by name, or
        ``enqueue(send_email, to=..., subject=...)`` through the task object: arguments checked
        by mypy against the function, the handle typed by its result, the task's declared
        defaults applied, options via ``send_email.options(delay=5)``.
        """
        if isinstance(name, Task):
            return self._enqueue(**name.request(args, kwargs), defaults=name.defaults)
        return self._enqueue(name, *args, **kwargs)

    def _enqueue(
        self,
        name: str,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        defaults: TaskDefaults | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        eta: datetime | str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        expires: float | timedelta | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
        unique: bool | None = None,
    ) -> TaskHandle:
        """Enqueue one task; one round trip. Returns its handle (``.id``)."""
        mw = self._mw()
        d = defaults or self._defaults(name)
        if mw is None:
            q, task = build_task(
                self.settings, name, args, kwargs, defaults=d, queue=queue,
                priority=priority, delay=delay, eta=eta, max_retries=max_retries,
                timeout=timeout, idempotency_key=idempotency_key, expires=expires,
                metadata=metadata, unique=unique,
            )  # fmt: skip
        else:
            req = self._request(name, args, kwargs, dict(
                queue=queue, priority=priority, delay=delay, eta=eta, max_retries=max_retries,
                timeout=timeout, idempotency_key=idempotency_key, expires=expires,
                metadata=metadata, unique=unique,
            ), d)  # fmt: skip
            before_enqueue_sync(mw, req)
            q, task = self._build(req, d)
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return self._send({q: [(0, task)]}, 1)[0]
        # The short path: one script call, without the batch plan, closures and handle list of
        # _send (a sixth of a single enqueue's client time).
        return self._handle(q, self._io(lambda: self._scripts.run(call)))

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Enqueue many tasks; see :meth:`AsyncClient.enqueue_many`."""
        mw = self._mw()
        if mw is None:
            by_queue, n = self._group(items)
        else:
            reqs = self._requests(items)
            for req in reqs:
                before_enqueue_sync(mw, req)
            by_queue, n = self._group_requests(reqs)
        return self._send(by_queue, n)

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
                self.redis.sadd(self.keys.queues, *new)
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
        mw, reqs = self._mw(), None
        if mw is not None:
            reqs = self._step_requests(flow)
            for req in reqs:
                before_enqueue_sync(mw, req)
        p, call, away = self._flow_plan(flow, reqs)

        def go() -> Any:
            queues = {s.queue for s in p.steps}
            new = self._unregistered(queues)
            if new:
                self.redis.sadd(self.keys.queues, *new)
                self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
            raw = self._scripts.run(call)
            for c in self._put_calls(away):
                self._scripts.run(c)
            return raw

        return self._flow_handle(p, self._io(go))

    def _get_flow(self, task_id: str) -> TaskInfo:
        fkey, _ = self._flow_keys(task_id)
        rec: Any = self._io(lambda: self.redis.hgetall(fkey))
        statuses: list[Any] = []
        if rec:
            pipe = self.redis.pipeline(transaction=False)
            for k in self._step_keys(rec):
                pipe.hmget(k, "status", "name")
            statuses = self._io(pipe.execute)
        return self._flow_info(task_id, rec, statuses)

    def get(self, task_id: str) -> TaskInfo:
        """The task's record; raises :class:`dtq.UnknownTask` if there is none (a workflow:
        see :meth:`AsyncClient.get`)."""
        if is_flow_id(task_id):
            return self._get_flow(task_id)
        queue, tid = split_task_id(task_id)
        qk = self.keys.queue(queue)
        rec: dict[str, str] = self._io(
            lambda: self.redis.hgetall(qk.task(tid))  # type: ignore[arg-type,return-value]
        )
        decl = None
        if pending_declared(rec):  # not claimed yet, some values left to the worker's declaration
            decl = self._io(lambda: self.redis.hget(qk.decl, rec.get("name", "")))
        return self._info(task_id, rec, decl)  # type: ignore[arg-type]

    @overload
    def result(self, task_id: TaskHandle[R], timeout: float | None = None) -> R: ...

    @overload
    def result(self, task_id: str, timeout: float | None = None) -> Any: ...

    def result(self, task_id: str | TaskHandle[Any], timeout: float | None = None) -> Any:
        """Wait until the task ends; return its result or raise :class:`dtq.TaskFailed`."""
        typed = not isinstance(task_id, str)  # a handle: its result decoded by return type
        if not isinstance(task_id, str):
            task_id = task_id.id
        queue, tid = split_task_id(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._subscribed(self.keys.queue(queue).done_channel(tid)) as ps:
            while True:
                info = self.get(task_id)
                if info.status.terminal:
                    return self._typed_outcome(info) if typed else self._outcome(info)
                remaining = 5.0 if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"task {task_id} still {info.status.value}")
                wait = min(remaining, 5.0)
                self._io(partial(ps.get_message, ignore_subscribe_messages=True, timeout=wait))

    @contextmanager
    def _subscribed(self, channel: str) -> Iterator[Any]:
        ps = self.redis.pubsub()  # type: ignore[no-untyped-call]
        try:
            self._io(lambda: ps.subscribe(channel))
            yield ps
        finally:
            ps.close()

    def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> bool:
        """Cancel a task or a workflow; see :meth:`AsyncClient.cancel`."""
        if is_flow_id(task_id):
            fc = self._flow_cancel_call(task_id, reason)  # (one nonce for all its re-sends)
            raw = self._io(lambda: self._scripts.run(fc))
            if not raw or not raw[0]:
                raise UnknownTask(f"no workflow {task_id}")
            for step in raw[1:]:
                c = self._cancel_call(step, reason)
                res = sc.parse_cancel(self._io(lambda c=c: self._scripts.run(c)))  # type: ignore[misc]
                if res.outcome == "missing":  # on its way to its queue: it never runs
                    t = self._tomb_call(step, reason)
                    self._io(lambda t=t: self._scripts.run(t))  # type: ignore[misc]
            return bool(raw[0] in ("running", "failed"))
        call = self._cancel_call(task_id, reason)
        res = sc.parse_cancel(self._io(lambda: self._scripts.run(call)))
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return res.outcome in ("cancelled", "requested")

    def cancel_many(
        self, queue: str | None = None, name: str | None = None, reason: str = CANCEL_REASON
    ) -> CancelSummary:
        """Cancel every unfinished task of a queue and/or task name (see dtq.cancellation)."""
        from dtq.cancellation import cancel_many

        return self._io(lambda: cancel_many(self, queue, name, reason))
