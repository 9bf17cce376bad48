# long: the two clients and all they share; each request is written once, as a step generator
"""The client SDK: :class:`AsyncClient` and the blocking :class:`Client`, with the same methods.

:class:`ClientBase` writes each request once, as a generator of its I/O steps; each client drives
it with its own I/O (``_drive``). Redis errors surface as :class:`dtq.RedisUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack, overload

import redis
import redis.asyncio as aredis

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.declared import pending as pending_declared
from dtq.errors import (
    InvalidRequest,
    RedisUnavailable,
    SerializationError,
    TaskFailed,
    UndeclaredTaskWarning,
    UnknownTask,
    unreachable,
)
from dtq.middleware import EnqueueRequest, Hooks, before_enqueue_async, before_enqueue_sync
from dtq.models import GroupPage, TaskHandle, TaskInfo, TaskStatus
from dtq.schedules import ops as sched
from dtq.schedules.model import Schedule, ScheduleInfo
from dtq.sdk import groupops
from dtq.sdk.coalesce import Coalescer, SyncCoalescer
from dtq.sdk.donewait import DoneWaits, SyncDoneWaits
from dtq.sdk.requests import ENQUEUE_FIELDS, EnqueueOptions, TaskDefaults, build_task, check_fields
from dtq.settings import Settings, checked_redis_url, load_settings
from dtq.store import partitions
from dtq.store.cluster import ascan_tasks, scan_tasks
from dtq.store.connection import RETRY_BASE_S, RETRY_CAP_S, async_redis, is_cluster, sync_redis
from dtq.store.eviction import is_oom, out_of_memory_message
from dtq.store.keys import Keys, QueueKeys, QueueRef, is_flow_id, make_task_id, split_task_id
from dtq.store.record import Field
from dtq.task import Task

if TYPE_CHECKING:
    from dtq.app import App

__all__ = ["AsyncClient", "CancelSummary", "Client"]

T = TypeVar("T")
Steps = Generator[Any, Any, T]  # a request's I/O steps (see ClientBase._get_steps)


@dataclasses.dataclass(frozen=True, slots=True)
class TaskScan:
    """A step: one SCAN call over a queue's task records (dtq.store.cluster.scan_tasks)."""

    qk: QueueKeys
    cursor: int
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pipelined:
    """A step: script calls sent in one pipeline; the reply is theirs, in order."""

    calls: list[sc.Call]


@dataclasses.dataclass(frozen=True, slots=True)
class Streamed:
    """A step: script calls streamed over one connection, each reply handed to ``each``."""

    calls: Iterable[sc.Call]
    each: Callable[[int, Any], None]


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """A step: wait ``seconds``, or until ``woken`` (an event) is set first."""

    seconds: float
    woken: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Hooked:
    """A step: ``before_enqueue`` middleware sees (and may change) one request."""

    hooks: Hooks
    req: EnqueueRequest


P = ParamSpec("P")
R = TypeVar("R")
_STATUS = {s.value: s for s in TaskStatus}
# Tasks per enqueue.lua call of a bulk enqueue sent in parts; a small first part starts Redis early.
BULK_PART = 250
BULK_FIRST = 32


def _bulk_parts(n: int) -> list[tuple[int, int]]:
    """(start, end) of each part of an ``n``-task bulk enqueue."""
    first = min(n, BULK_FIRST)
    return [(0, first)] + [(i, min(n, i + BULK_PART)) for i in range(first, n, BULK_PART)]


CANCEL_REASON = "cancelled by request"
# How long a client trusts its registration of a queue, and its answer to "does a live worker
# declare this name?".
REGISTER_EVERY_S = 60.0
DECLARED_EVERY_S = 300.0

BLIPS = (redis.ConnectionError, redis.TimeoutError)
# Replies of a Redis that cannot take writes now (the call did not take effect).
REFUSED = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)
REDIS_ERRORS = BLIPS + REFUSED


def redis_error(exc: Exception) -> RedisUnavailable:
    """The one-line error of a Redis that cannot be reached (BLIPS) or refused a write."""
    if not isinstance(exc, REFUSED):
        return RedisUnavailable(unreachable(exc))
    if is_oom(exc):
        return RedisUnavailable(out_of_memory_message(exc))
    return RedisUnavailable(f"Redis refused the write: {exc}")


def _ms(time_reply: Any) -> float:
    """Milliseconds of a TIME reply (seconds, microseconds)."""
    return int(time_reply[0]) * 1000 + int(time_reply[1]) / 1000


def resend_delay(attempt: int) -> float:
    """Jittered backoff before a re-send (as redis-py's own)."""
    return random.uniform(0, min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt))


class ResultWait:
    """One ``result()`` wait: its task, channel, deadline, and its pauses while Redis is away
    (docs/faults.md, "A result() wait during an outage")."""

    def __init__(self, keys: Keys, task: str | TaskHandle[Any], timeout: float | None) -> None:
        self.typed = not isinstance(task, str)  # a handle: its result decoded by return type
        self.task_id = task if isinstance(task, str) else task.id
        queue, tid = split_task_id(self.task_id)
        self.channel = keys.queue(queue).done_channel(tid)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._failures = 0

    def left(self, info: TaskInfo) -> float:
        """How long to wait for the announcement (at most 5 s); TimeoutError past the deadline."""
        self._failures = 0
        remaining = 5.0 if self.deadline is None else self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"task {self.task_id} still {info.status.value}")
        return min(remaining, 5.0)

    def pause(self, exc: RedisUnavailable) -> float:
        """The pause before reading again while Redis is away; raises ``exc`` past the deadline
        or when Redis refused the credentials."""
        now = time.monotonic()
        refused = isinstance(exc.__context__, redis.exceptions.AuthenticationError)
        if refused or (self.deadline is not None and now >= self.deadline):
            raise exc
        delay = RETRY_BASE_S + resend_delay(self._failures)
        self._failures += 1
        return delay if self.deadline is None else min(delay, self.deadline - now)


# cancel_many: records found by SCAN in pages (tasks parked by a limit have no stream entry).
PAGE = 500
UNFINISHED = ("queued", "scheduled", "running")


@dataclasses.dataclass(frozen=True, slots=True)
class CancelSummary:
    """What a bulk cancel did."""

    cancelled: int = 0
    """Queued or scheduled tasks that ended ``cancelled``."""
    requested: int = 0
    """Running tasks whose workers were asked to stop them."""

    @property
    def total(self) -> int:
        return self.cancelled + self.requested

    def to_dict(self) -> dict[str, int]:
        return {"cancelled": self.cancelled, "requested": self.requested}

    def __add__(self, other: CancelSummary) -> CancelSummary:
        return CancelSummary(self.cancelled + other.cancelled, self.requested + other.requested)


def _statuses(r: Any, keys: list[Any]) -> Any:
    """Each record's status and name, pipelined (a reply, or its awaitable on asyncio)."""
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.hmget(k, [Field.STATUS, Field.NAME])
    return pipe.execute()


class ClientBase:
    _done: Any  # each client's result() waits on one subscription (dtq.sdk.donewait)

    def __init__(self, url: str | None, settings: Settings | None, app: App | None) -> None:
        if settings is None:
            settings = app.settings if app is not None else load_settings()
        if url is not None:  # (model_copy does not validate: check it here)
            settings = settings.model_copy(update={"redis_url": checked_redis_url(url)})
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.app = app
        # Queue -> until when this client trusts its registration in P:queues.
        self._registered: dict[str, float] = {}
        # (logical queue, task name) -> until when "a live worker declares it" holds (inf: warned).
        self._declared: dict[tuple[str, str], float] = {}
        self._redis_clock_ms: float | None = None  # Redis TIME - monotonic (a cluster's reads)
        self._hist_ttl_s = settings.stats_retention_h * 3600  # (dtq.stats; 0: none)

    def _connection_options(self) -> dict[str, Any]:
        return {
            "retries": self.settings.client_retries,
            "wait_for_connection": True,
            "check_eviction": True,
            "decode_responses": True,
        }

    def _defaults(self, name: str) -> TaskDefaults | None:
        if self.app is None or not isinstance(name, str):  # a bad name: build_task says so
            return None
        return self.app.defaults_for(name)

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

    def _task(
        self, name: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, sc.NewTask] | Steps[tuple[str, sc.NewTask]]:
        """``enqueue``'s queue and task; with ``before_enqueue`` middleware, the steps that let it
        see the request first (the client drives them)."""
        if isinstance(name, Task):
            return self._by_name(**name.request(args, kwargs), defaults=name.defaults)
        return self._by_name(name, *args, **kwargs)

    def _by_name(
        self,
        name: str,
        args: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        defaults: TaskDefaults | None = None,
        **options: Any,
    ) -> tuple[str, sc.NewTask] | Steps[tuple[str, sc.NewTask]]:
        """:meth:`_task` of an ``enqueue`` by name; ``options`` are :class:`EnqueueOptions`."""
        if "headers" in options:  # build_task's, set by middleware only: not an option
            raise TypeError("enqueue() got an unexpected keyword argument 'headers'")
        d = defaults or self._defaults(name)
        mw = self._mw()
        if mw is None:
            return build_task(self.settings, name, args, kwargs, defaults=d, **options)
        return self._hooked_steps(mw, self._request(name, args, kwargs, options, d), d)

    def _hooked_steps(
        self, mw: Hooks, req: EnqueueRequest, defaults: TaskDefaults | None
    ) -> Steps[tuple[str, sc.NewTask]]:
        yield Hooked(mw, req)
        return self._build(req, defaults)

    def _build(
        self, req: EnqueueRequest, defaults: TaskDefaults | None = None
    ) -> tuple[str, sc.NewTask]:
        return wf.build_request(self.settings, req, defaults or self._defaults(req.name))

    def _unregistered(self, queues: Iterable[str]) -> list[str]:
        """Those of ``queues`` this client has not registered lately."""
        now = time.monotonic()
        return [q for q in queues if self._registered.get(q, 0.0) < now]

    def _single(self, queue: str, task: sc.NewTask) -> sc.Call | None:
        """The script call enqueueing ``task`` alone, if this client registered ``queue``."""
        until = self._registered.get(queue)
        if until is None or until < time.monotonic():
            return None
        return sc.enqueue_one_call(
            self.keys.prefix, queue, task, self.settings.events_maxlen, hist_ttl_s=self._hist_ttl_s
        )

    @staticmethod
    def _handle(queue: str, raw: Any, b: int = 0) -> TaskHandle:
        """The handle of the task whose 3 fields of enqueue.lua's reply start at ``raw[b]``."""
        tid, status = raw[b], raw[b + 1]
        if type(tid) is not str:
            tid, status = tid.decode(), status.decode()
        ref = QueueRef.parse(queue)  # a partition's task: the id names its logical queue
        return TaskHandle(ref.task_id(tid), ref.queue, _STATUS[status], int(raw[b + 2]) == 1)

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

    def _cancel_call(self, task_id: str, reason: str) -> sc.Call:
        queue, tid = split_task_id(task_id)
        return sc.cancel_call(
            self.keys.queue(queue),
            tid,
            events_maxlen=self.settings.events_maxlen,
            ttl_s=self.settings.result_ttl_s,
            hint_channel=self.keys.cancel_channel,
            reason=reason,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )

    @staticmethod
    def _info(task_id: str, rec: dict[str, str], declared: str | None = None) -> TaskInfo:
        if not rec:
            raise UnknownTask(f"no task {task_id} (never enqueued, or its record expired)")
        queue, _ = split_task_id(task_id)
        return TaskInfo.from_record(task_id, queue, rec, declared)

    # --- requests shared by both clients: generators of their I/O steps ----------------------
    # Each yields a step (a script call, a TaskScan, Pipelined calls, a Hooked request, or a
    # function of the Redis client) and is sent its reply; each client's ``_drive`` does the I/O.

    def _get_steps(self, task_id: str) -> Steps[TaskInfo]:
        queue, tid = split_task_id(task_id)
        if is_flow_id(task_id):
            rec = yield lambda r: r.hgetall(self.keys.queue(queue).flow(tid))
            if not rec:
                raise UnknownTask(f"no workflow {task_id} (never enqueued, or its record expired)")
            steps = [split_task_id(rec[f"q{i}"]) for i in range(int(rec.get("n", 0)))]
            keys = [self.keys.queue(q).task(t) for q, t in steps]
            d = wf.flow_record(task_id, rec, (yield partial(_statuses, keys=keys)))
            info = TaskInfo.from_record(task_id, queue, d["rec"])
            return dataclasses.replace(info, steps=d["steps"], tree=d["tree"])
        qk = self.keys.queue(queue)
        rec = yield lambda r: r.hgetall(qk.task(tid))
        decl = None
        if pending_declared(rec):  # not claimed yet, some values left to the worker's declaration
            decl = yield lambda r: r.hget(qk.decl, rec.get(Field.NAME, ""))
        return self._info(task_id, rec, decl)

    def _cancel_steps(self, task_id: str, reason: str) -> Steps[bool]:
        if is_flow_id(task_id):
            home, ftid = split_task_id(task_id)
            ttl, em = self.settings.result_ttl_s, self.settings.events_maxlen
            call = sc.flow_cancel_call(
                self.keys.queue(home), ftid, reason, ttl, em, nonce=sc.new_nonce()
            )  # (a nonce: a re-send after a blip gets this call's own answer)
            fc = sc.parse_flow_cancel((yield call))
            if fc.before is sc.FlowStatus.NONE:
                raise UnknownTask(f"no workflow {task_id}")
            for step in fc.steps:
                res = sc.parse_cancel((yield self._cancel_call(step, reason)))
                if res.outcome is sc.CancelOutcome.MISSING:  # on its way to its queue: never runs
                    q, tid = split_task_id(step)
                    tomb = sc.parse_created(
                        (yield sc.flow_tomb_call(self.keys.queue(q), tid, reason, ttl))
                    )
                    if tomb is sc.Created.EXISTED:  # put there meanwhile: cancel it as a task
                        yield self._cancel_call(step, reason)
            return fc.before in (sc.FlowStatus.RUNNING, sc.FlowStatus.FAILED)
        res = sc.parse_cancel((yield self._cancel_call(task_id, reason)))
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return res.outcome in ("cancelled", "requested")

    def _send_steps(
        self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int
    ) -> Steps[list[TaskHandle]]:
        """Enqueue the tasks of ``by_queue`` (at their items' places of ``n``): one enqueue.lua
        call per queue, or parts streamed over one connection; new queues are registered first."""
        out: list[TaskHandle | None] = [None] * n
        plan = self._plan(by_queue)
        hist_ttl_s, em = self._hist_ttl_s, self.settings.events_maxlen

        def calls() -> Iterator[sc.Call]:  # (encoded as they are sent)
            for q, tasks in plan:
                yield sc.enqueue_call(
                    self.keys.queue(q), [t for _, t in tasks], em, hist_ttl_s=hist_ttl_s
                )

        def place(k: int, raw: Any) -> None:  # (enqueue.lua's reply: 3 fields per task)
            q, tasks = plan[k]
            for j, (i, _) in enumerate(tasks):
                out[i] = self._handle(q, raw, 3 * j)

        attempt = 0
        while True:
            try:
                new = self._unregistered(by_queue)
                if new:  # once per queue and client: the registry lists the queues for operators
                    counts = self.settings.queue_partitions
                    yield from partitions.register_steps(self.keys, counts, new)
                    self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
                if len(plan) == 1:  # one round trip
                    place(0, (yield next(calls())))
                elif plan:
                    yield Streamed(calls(), place)
                return [h for h in out if h is not None]
            except RedisUnavailable as exc:
                # A streamed batch cut by a blip is sent again whole (its parts that ran answer
                # with their tasks); redis-py re-sends single calls itself.
                blip = isinstance(exc.__context__, BLIPS)
                if not blip or len(plan) == 1 or attempt >= self.settings.client_retries:
                    raise
            yield Pause(resend_delay(attempt))
            attempt += 1

    def _result_steps(self, task_id: str | TaskHandle[Any], timeout: float | None) -> Steps[Any]:
        """Wait until the task ends; its result. The waits share one subscription (donewait)."""
        wait, woken = ResultWait(self.keys, task_id, timeout), None  # (woken: subscribed)
        done = self._done
        try:
            while True:
                try:
                    if woken is None:  # (one subscription for all waits)
                        woken = yield lambda _: done.add(wait.channel)
                    woken.clear()  # (an announcement from here on is not missed: read after it)
                    info = yield from self._get_steps(wait.task_id)
                except RedisUnavailable as exc:  # Redis away: read again until the deadline
                    yield Pause(wait.pause(exc))
                    continue
                if info.status.terminal:
                    return self._typed_outcome(info) if wait.typed else self._outcome(info)
                yield Pause(wait.left(info), woken)
        finally:
            if woken is not None:
                yield lambda _: done.remove(wait.channel, woken)

    def _cancel_many_steps(
        self, queue: str | None, name: str | None, reason: str | None
    ) -> Steps[CancelSummary]:
        """Cancel every unfinished task of ``queue`` (all known queues if None) named ``name``."""
        if queue is None and name is None:
            raise InvalidRequest("cancel_many needs a queue, a task name, or both")
        found: Any = (
            partitions.expand([queue], self.settings.queue_partitions)  # (its partitions)
            if queue
            else (yield lambda r: r.smembers(self.keys.queues))
        )
        total = CancelSummary()
        for q in sorted(found):
            qk = self.keys.queue(q)
            base = qk.task_base
            cursor = 0
            while True:
                cursor, keys = yield TaskScan(qk, cursor, PAGE)
                tids = [str(k)[len(base) :] for k in keys]
                if tids:
                    recs = yield partial(_statuses, keys=keys)
                    chosen = [
                        t
                        for t, (status, tname) in zip(tids, recs, strict=True)
                        if status in UNFINISHED and (name is None or tname == name)
                    ]
                    if chosen:
                        why = reason or CANCEL_REASON
                        calls = [self._cancel_call(make_task_id(q, t), why) for t in chosen]
                        res = [sc.parse_cancel(r).outcome for r in (yield Pipelined(calls))]
                        total += CancelSummary(
                            res.count(sc.CancelOutcome.CANCELLED),
                            res.count(sc.CancelOutcome.REQUESTED),
                        )
                if int(cursor) == 0:
                    break
        return total

    def _grouped_steps(
        self, items: Iterable[Mapping[str, Any]]
    ) -> Steps[tuple[dict[str, list[tuple[int, sc.NewTask]]], int]]:
        """enqueue_many's tasks by queue, and their count. With ``before_enqueue`` middleware,
        every item is checked first, then each request seen by it, then built."""
        mw = self._mw()
        by_queue: dict[str, list[tuple[int, sc.NewTask]]] = {}
        reqs: list[EnqueueRequest] = []
        n = 0
        for i, item in enumerate(items):
            try:
                plain = "name" in item and item.keys() <= ENQUEUE_FIELDS
            except (TypeError, AttributeError):  # not a mapping
                raise InvalidRequest(f"item {i} is not a dict of enqueue fields") from None
            if not plain:
                check_fields(item)  # says which field is wrong
            n = i + 1
            if mw is not None:
                opts = {k: v for k, v in item.items() if k not in ("name", "args", "kwargs")}
                reqs.append(self._request(item["name"], item.get("args"), item.get("kwargs"), opts))
                continue
            q, task = build_task(self.settings, defaults=self._defaults(item["name"]), **item)
            group = by_queue.get(q)
            if group is None:
                group = by_queue[q] = []
            group.append((i, task))
        if mw is not None:
            for req in reqs:
                yield Hooked(mw, req)
            for i, req in enumerate(reqs):
                q, task = self._build(req)
                by_queue.setdefault(q, []).append((i, task))
        return by_queue, n

    def _workflow_steps(self, flow: wf.Flow) -> Steps[TaskHandle]:
        reqs = None  # without middleware the steps are built from the flow itself
        if (mw := self._mw()) is not None:
            reqs = [
                self._request(s.name, list(s.args), s.kwargs, dict(s.options), s.defaults)
                for s in wf.sigs(flow)
            ]
            for req in reqs:
                yield Hooked(mw, req)
        st = self.settings
        p = wf.plan(flow, st, self._defaults, requests=reqs)
        call, away = wf.enqueue_call(self.keys, p, st.events_maxlen, st.max_payload_bytes)
        new = self._unregistered({s.queue for s in p.steps})
        if new:
            yield lambda r: r.sadd(self.keys.queues, *new)
            self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
        raw = yield call
        # A new flow's first steps on other queues (a worker moves them too, from the outbox).
        for q, s in away:
            yield sc.flow_put_call(self.keys.queue(q), s, json.loads(s)[3], st.events_maxlen)
        return TaskHandle(p.id, p.home, TaskStatus.QUEUED, sc.parse_flow_enqueue(raw).created)

    def _undeclared(self, done: Iterable[tuple[TaskHandle, str]]) -> dict[tuple[str, str], str]:
        """Of ``done`` (handles and names), the (queue, name) pairs due for a check, each with
        the physical queue whose stamps tell (once per pair every DECLARED_EVERY_S)."""
        if not self.settings.client_warn_undeclared:
            return {}
        due: dict[tuple[str, str], str] = {}
        now = time.monotonic()
        for h, name in done:
            pair = (h.queue, name)
            until = self._declared.get(pair)
            if until is None or until < now:
                self._declared[pair] = now + DECLARED_EVERY_S
                due[pair] = split_task_id(h.id)[0]  # (a partition's stamps: its own)
        return due

    @staticmethod
    def _named(
        by_queue: dict[str, list[tuple[int, sc.NewTask]]], hs: list[TaskHandle]
    ) -> Iterator[tuple[TaskHandle, str]]:
        """Each task of a bulk enqueue's handle and name (for _undeclared)."""
        for tasks in by_queue.values():
            for i, task in tasks:
                yield hs[i], task.name

    def _declared_steps(self, due: dict[tuple[str, str], str]) -> Steps[list[str]]:
        """The warnings for the pairs of ``due`` no live worker declared within
        DTQ_DECLARATION_GRACE_S (a cluster's pipeline cannot carry TIME: read once per client)."""
        keys = sorted({self.keys.queue(p).decl_seen for p in due.values()})

        def read(r: Any) -> Any:
            pipe = r.pipeline(transaction=False)
            for k in keys:
                pipe.hgetall(k)
            if not is_cluster(r):
                pipe.time()
            return pipe.execute()

        replies = yield read
        mono_ms = time.monotonic() * 1000
        if len(replies) > len(keys):
            self._redis_clock_ms = _ms(replies[-1]) - mono_ms
        elif self._redis_clock_ms is None:
            self._redis_clock_ms = _ms((yield lambda r: r.time())) - mono_ms
        oldest = mono_ms + self._redis_clock_ms - self.settings.declaration_grace_s * 1000
        live = {
            k: {sc.to_str(n) for n, ms in seen.items() if int(ms) >= oldest}
            for k, seen in zip(keys, replies, strict=False)  # (TIME, if there, is left over)
        }
        out = []
        for (q, name), p in due.items():
            names = live[self.keys.queue(p).decl_seen]
            if name in names:
                continue
            self._declared[(q, name)] = math.inf  # warned: never again by this client
            out.append(
                f"no live worker of queue {q!r} declares task {name!r}: it waits, and fails on "
                "the worker that takes it"
                if names
                else f"no live worker consumes queue {q!r}: the task waits for one"
            )
        return out

    @staticmethod
    def _warn(texts: list[str]) -> None:
        for text in texts:  # (stacklevel: the caller of enqueue, through _warn_undeclared)
            warnings.warn(text, UndeclaredTaskWarning, stacklevel=4)

    @staticmethod
    def _outcome(info: TaskInfo) -> Any:
        if info.status == TaskStatus.SUCCEEDED:
            return info.result
        raise TaskFailed(info.id, info.status.value, info.error)

    def _typed_outcome(self, info: TaskInfo) -> Any:
        """The result, decoded to the return type of a task the app knows (docs/arguments.md)."""
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


class AsyncClient(ClientBase):
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
            async_redis(self.settings.redis_url, **self._connection_options()),
            fast_lane=self.settings.fast_lane,
        )
        self._scripts = sc.AsyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)
        self._done = DoneWaits(self.redis)
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
        built = self._task(name, args, kwargs)
        if not isinstance(built, tuple):  # before_enqueue middleware sees the request first
            built = await self._drive(built)
        q, task = built
        co = self._coalesced
        if co is None:
            h = await self._enqueue_one(q, task)
        else:  # an enqueue of q in flight: this one goes in the batch after it
            h = await co.call(q, task, partial(self._enqueue_one, q, task))
        # (a task object exists: no check whether a worker declares it)
        if not isinstance(name, Task) and (due := self._undeclared(((h, name),))):
            await self._warn_undeclared(due)  # once per DECLARED_EVERY_S, not per task
        return h

    async def _enqueue_one(self, q: str, task: sc.NewTask) -> TaskHandle:
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return (await self._send({q: [(0, task)]}, 1))[0]
        return self._handle(q, await self._step(call))

    async def _enqueue_batch(self, queue: str, tasks: Sequence[sc.NewTask]) -> list[TaskHandle]:
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
        """Warn about each name of ``due`` no live worker declares (a Redis that cannot answer:
        checked again next period)."""
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
        return await self._drive(self._workflow_steps(flow))

    async def _drive(self, steps: Steps[T]) -> T:
        """Do a request's I/O steps: each reply is sent back, each error raised at its step."""
        go: Callable[[Any], Any] = steps.send
        arg: Any = None
        while True:
            try:
                step = go(arg)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                arg, go = await self._step(step), steps.send
            except BaseException as exc:  # (also a cancel: a wait's finally unsubscribes)
                arg, go = exc, steps.throw

    async def _step(self, step: Any) -> Any:
        """One step's I/O (see ClientBase's step generators)."""
        try:
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
        except REDIS_ERRORS as exc:
            raise redis_error(exc) from None

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
        """Cancel every unfinished task of a queue and/or task name (see ``PAGE``)."""
        return await self._drive(self._cancel_many_steps(queue, name, reason))

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
        An enabled schedule keeps its own next fire time."""
        return await self._drive(sched.set_enabled_steps(self.keys, name, queue, enabled))

    async def run_schedule_now(self, name: str, queue: str = "default") -> str:
        """Enqueue the schedule's task now, as a fire would (its metadata names the schedule);
        the schedule's own fire times do not move. Returns the task id."""
        s = await self._drive(sched.stored_steps(self.keys, name, queue))
        return (await self.enqueue(s.task, **sched.run_now_request(s))).id

    async def pause_group(self, queue: str, group: str) -> bool:
        """Hold ``group`` of ``queue`` (every partition): none of its tasks starts until
        :meth:`resume_group`; its running tasks finish, the other groups go on. True when this
        call held it, False when it was held already."""
        return await self._drive(groupops.hold_steps(self.keys, self.settings, queue, group, True))

    async def resume_group(self, queue: str, group: str) -> bool:
        """Release ``group`` of ``queue`` held by :meth:`pause_group`. True when it was held."""
        return await self._drive(groupops.hold_steps(self.keys, self.settings, queue, group, False))

    async def groups(
        self, queue: str, *, cursor: str | None = None, limit: int = groupops.GROUP_PAGE
    ) -> GroupPage:
        """A page of ``queue``'s active groups (longest active first), then its held idle
        ones: waiting, running, held, oldest waiting age. Pass ``next_cursor`` back for the
        next page; each page does bounded work, so it may hold fewer than ``limit``."""
        return await self._drive(
            groupops.list_steps(self.keys, self.settings, queue, cursor, limit)
        )


class Client(ClientBase):
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
        if redis_client is None:
            try:  # (a cluster's client connects now)
                redis_client = sync_redis(self.settings.redis_url, **self._connection_options())
            except REDIS_ERRORS as exc:
                raise redis_error(exc) from None
        self.redis: redis.Redis = redis_client
        self._scripts = sc.SyncScripts(
            self.redis, replay_safe=True, fast_lane=self.settings.fast_lane
        )  # (replay_safe: docs/faults.md)
        self._done = SyncDoneWaits(self.redis, self.keys.wake_channel)
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
        """Enqueue one task by name or through the task object; see :meth:`AsyncClient.enqueue`."""
        built = self._task(name, args, kwargs)
        if not isinstance(built, tuple):  # before_enqueue middleware sees the request first
            built = self._drive(built)
        q, task = built
        co = self._coalesced
        if co is None:
            h = self._enqueue_one(q, task)
        else:  # another thread's enqueue of q in flight: this one goes in the batch after it
            h = co.call(q, task, partial(self._enqueue_one, q, task))
        # (a task object exists: no check whether a worker declares it)
        if not isinstance(name, Task) and (due := self._undeclared(((h, name),))):
            self._warn_undeclared(due)  # once per DECLARED_EVERY_S, not per task
        return h

    def _enqueue_one(self, q: str, task: sc.NewTask) -> TaskHandle:
        call = self._single(q, task)
        if call is None:  # the queue's first enqueue by this client registers it
            return self._send({q: [(0, task)]}, 1)[0]
        return self._handle(q, self._step(call))

    def _enqueue_batch(self, queue: str, tasks: Sequence[sc.NewTask]) -> list[TaskHandle]:
        return self._send({queue: list(enumerate(tasks))}, len(tasks))

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[TaskHandle]:
        """Enqueue many tasks; see :meth:`AsyncClient.enqueue_many`."""
        by_queue, n = self._drive(self._grouped_steps(items))
        hs = self._send(by_queue, n)
        if due := self._undeclared(self._named(by_queue, hs)):
            self._warn_undeclared(due)
        return hs

    def _warn_undeclared(self, due: dict[tuple[str, str], str]) -> None:
        with contextlib.suppress(RedisUnavailable, redis.RedisError):
            self._warn(self._drive(self._declared_steps(due)))

    def _send(self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int) -> list[TaskHandle]:
        return self._drive(self._send_steps(by_queue, n))

    def enqueue_workflow(self, flow: wf.Flow) -> TaskHandle:
        """Enqueue a workflow; see :meth:`AsyncClient.enqueue_workflow`."""
        return self._drive(self._workflow_steps(flow))

    def _drive(self, steps: Steps[T]) -> T:
        go: Callable[[Any], Any] = steps.send
        arg: Any = None
        while True:
            try:
                step = go(arg)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                arg, go = self._step(step), steps.send
            except BaseException as exc:
                arg, go = exc, steps.throw

    def _step(self, step: Any) -> Any:
        try:
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
                wait = time.sleep if step.woken is None else step.woken.wait
                return wait(step.seconds)
            return step(self.redis)
        except REDIS_ERRORS as exc:
            raise redis_error(exc) from None

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
        """Cancel every unfinished task of a queue and/or task name (see ``PAGE``)."""
        return self._drive(self._cancel_many_steps(queue, name, reason))

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

    def pause_group(self, queue: str, group: str) -> bool:
        """Hold ``group`` of ``queue``; see :meth:`AsyncClient.pause_group`."""
        return self._drive(groupops.hold_steps(self.keys, self.settings, queue, group, True))

    def resume_group(self, queue: str, group: str) -> bool:
        """Release ``group`` of ``queue``; see :meth:`AsyncClient.resume_group`."""
        return self._drive(groupops.hold_steps(self.keys, self.settings, queue, group, False))

    def groups(
        self, queue: str, *, cursor: str | None = None, limit: int = groupops.GROUP_PAGE
    ) -> GroupPage:
        """A page of ``queue``'s groups; see :meth:`AsyncClient.groups`."""
        return self._drive(groupops.list_steps(self.keys, self.settings, queue, cursor, limit))
