"""What :class:`dtq.Client` and :class:`dtq.AsyncClient` share: the request building (checks
in :mod:`dtq.requests`), the script calls, the bulk plan, and each request written once as a
generator of its I/O steps (``_Base._get_steps``), which each client drives with its own I/O."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import (
    Generator,
    Iterable,
    Mapping,
)
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import redis

from dtq import scripts as sc
from dtq import workflows as wf
from dtq.app import App
from dtq.connection import RETRY_BASE_S, RETRY_CAP_S
from dtq.declared import pending as pending_declared
from dtq.errors import (
    InvalidRequest,
    RedisUnavailable,
    SerializationError,
    TaskFailed,
    UnknownTask,
    unreachable,
)
from dtq.eviction import is_oom, out_of_memory_message
from dtq.keys import PARTITION_SEP, Keys, QueueKeys, is_flow_id, make_task_id, split_task_id
from dtq.middleware import EnqueueRequest, Hooks
from dtq.models import TaskHandle, TaskInfo, TaskStatus
from dtq.partitions import logical
from dtq.record import Field
from dtq.requests import ENQUEUE_FIELDS, TaskDefaults, build_task, check_fields
from dtq.settings import Settings, checked_redis_url, load_settings

if TYPE_CHECKING:
    pass


T = TypeVar("T")
Steps = Generator[Any, Any, T]
"""A request written once for both clients: it yields its I/O steps (see _Base._get_steps)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskScan:
    """A step: one SCAN call over a queue's task records (dtq.cluster.scan_tasks)."""

    qk: QueueKeys
    cursor: int
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pipelined:
    """A step: script calls sent in one pipeline; the reply is theirs, in order."""

    calls: list[sc.Call]


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
    return keys.cancel_channel


def _unavailable(exc: Exception) -> RedisUnavailable:
    return RedisUnavailable(unreachable(exc))


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
        # Whether records may leave out their defaults (dtq.schema): read with each
        # registration; until the first, full records (valid at any schema).
        self._compact = False
        self._hist_ttl_s = settings.stats_retention_h * 3600  # (dtq.stats; 0: none)

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

    def _built(
        self,
        name: str,
        args: Any,
        kwargs: Mapping[str, Any] | None,
        defaults: TaskDefaults | None,
        options: dict[str, Any],
    ) -> tuple[str, sc.NewTask]:
        """One enqueue's task, built from ``enqueue``'s options (build_task's keywords)."""
        if "headers" in options:  # build_task's, set by middleware only: not an option
            raise TypeError("enqueue() got an unexpected keyword argument 'headers'")
        return build_task(self.settings, name, args, kwargs, defaults=defaults, **options)

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
        return sc.enqueue_one_call(
            self.keys.prefix, queue, task, self.settings.events_maxlen, full=not self._compact,
            hist_ttl_s=self._hist_ttl_s,
        )  # fmt: skip

    @staticmethod
    def _handle(queue: str, raw: Any, b: int = 0) -> TaskHandle:
        """The handle of the task whose 3 fields of enqueue.lua's reply start at ``raw[b]``."""
        tid, status = raw[b], raw[b + 1]
        if type(tid) is not str:
            tid, status = tid.decode(), status.decode()
        if PARTITION_SEP in queue:  # a partition's task: the id names its queue (dtq.partitions)
            return TaskHandle(
                make_task_id(queue, tid), logical(queue), _STATUS[status], int(raw[b + 2]) == 1
            )
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
        return sc.enqueue_call(
            self.keys.queue(queue), tasks, self.settings.events_maxlen, full=not self._compact,
            hist_ttl_s=self._hist_ttl_s,
        )  # fmt: skip

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
        return TaskHandle(p.id, p.home, TaskStatus.QUEUED, sc.parse_flow_enqueue(raw).created)

    def _put_calls(self, away: list[tuple[str, str]]) -> list[sc.Call]:
        """The moves of a new flow's first steps on other queues (idempotent: a worker moves
        them again from the outbox if this client did not)."""
        em = self.settings.events_maxlen
        return [sc.flow_put_call(self.keys.queue(q), s, json.loads(s)[3], em) for q, s in away]

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
        return sc.flow_cancel_call(
            self.keys.queue(home), ftid, reason, ttl, self.settings.events_maxlen,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )  # fmt: skip

    def _tomb_call(self, step_id: str, reason: str) -> sc.Call:
        """flow_tomb.lua for a cancelled flow's step whose record does not exist yet."""
        q, tid = split_task_id(step_id)
        return sc.flow_tomb_call(self.keys.queue(q), tid, reason, self.settings.result_ttl_s)

    # --- requests shared by both clients: generators of their I/O steps ----------------------
    # Each yields a step (a script call, a TaskScan, Pipelined script calls, or a function of
    # the Redis client whose value, awaited on an AsyncClient, is the reply) and is sent the
    # step's reply; each client's ``_drive`` does the I/O. So a request is written once and the
    # twins differ only in I/O.

    def _get_steps(self, task_id: str) -> Steps[TaskInfo]:
        if is_flow_id(task_id):
            fkey, _ = self._flow_keys(task_id)
            rec = yield lambda r: r.hgetall(fkey)
            statuses: list[Any] = []
            if rec:
                step_keys = self._step_keys(rec)

                def statuses_of(r: Any) -> Any:
                    pipe = r.pipeline(transaction=False)
                    for k in step_keys:
                        pipe.hmget(k, "status", "name")
                    return pipe.execute()

                statuses = yield statuses_of
            return self._flow_info(task_id, rec, statuses)
        queue, tid = split_task_id(task_id)
        qk = self.keys.queue(queue)
        rec = yield lambda r: r.hgetall(qk.task(tid))
        decl = None
        if pending_declared(rec):  # not claimed yet, some values left to the worker's declaration
            decl = yield lambda r: r.hget(qk.decl, rec.get(Field.NAME, ""))
        return self._info(task_id, rec, decl)

    def _cancel_steps(self, task_id: str, reason: str) -> Steps[bool]:
        if is_flow_id(task_id):
            # (one nonce for its re-sends)
            fc = sc.parse_flow_cancel((yield self._flow_cancel_call(task_id, reason)))
            if fc.before is sc.FlowStatus.NONE:
                raise UnknownTask(f"no workflow {task_id}")
            for step in fc.steps:
                res = sc.parse_cancel((yield self._cancel_call(step, reason)))
                if res.outcome is sc.CancelOutcome.MISSING:  # on its way to its queue: never runs
                    tomb = sc.parse_created((yield self._tomb_call(step, reason)))
                    if tomb is sc.Created.EXISTED:  # put there meanwhile: cancel it as a task
                        yield self._cancel_call(step, reason)
            return fc.before in (sc.FlowStatus.RUNNING, sc.FlowStatus.FAILED)
        res = sc.parse_cancel((yield self._cancel_call(task_id, reason)))
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return res.outcome in ("cancelled", "requested")

    def _workflow_steps(self, p: wf.Plan, call: sc.Call, away: list[tuple[str, str]]) -> Steps[Any]:
        new = self._unregistered({s.queue for s in p.steps})
        if new:
            yield lambda r: r.sadd(self.keys.queues, *new)
            self._registered.update(dict.fromkeys(new, time.monotonic() + REGISTER_EVERY_S))
        raw = yield call
        for c in self._put_calls(away):  # noqa: UP028 (yield from a list cannot take replies)
            yield c
        return raw

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
