"""Periodic schedules: cron expressions (time-zone and DST aware) and fixed intervals.

Declared in code with ``@app.periodic(...)`` or added at run time with :func:`add_schedule`.
Schedules are stored per queue (``P:{q}:schedules``, next fire times in
``P:{q}:schedules:next``); the scheduler leader of the queue (one worker at a time) fires them.
Each fire is one atomic step (``lua/schedule_fire.lua``: compare-and-set of the next fire time,
then the enqueue), so it is enqueued exactly once however many workers run.

Rules (see docs/lifecycle.md):

* A fire found late by at most ``grace`` seconds (default 60) still runs, once; older missed
  fires are skipped (recorded as ``schedule_missed`` events), so a long downtime never floods.
* ``overlap=False`` skips a fire while the previous task of the schedule is queued, scheduled
  or running.
* Cron times are wall-clock times in ``tz``. A time that does not exist (spring-forward gap)
  fires once, at the end of the gap. A time that occurs twice (fall-back) fires once, at its
  first occurrence, unless the expression runs every hour (hour field ``*``): then it follows
  real time and fires in both occurrences.
* ``every=N`` fires on multiples of N seconds since the Unix epoch (UTC), whatever the zone.
"""

from __future__ import annotations

import json
import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# croniter is imported where a cron expression is used: a worker without cron schedules (and
# every process that only enqueues) starts without it.
from dtq import codec
from dtq import scripts as sc
from dtq.errors import DtqError, InvalidRequest
from dtq.keys import Keys, QueueKeys, make_task_id
from dtq.models import ms_to_datetime
from dtq.requests import MAX_SPAN_S, TaskDefaults, build_task, check_task_name
from dtq.settings import CONTROL_RE, QUEUE_NAME_RE, Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis

    from dtq.app import App, Task
    from dtq.client import AsyncClient, Client

log = logging.getLogger("dtq.schedules")

DEFAULT_GRACE_S = 60.0
DISABLED = float("inf")
"""The next-fire score of a disabled schedule: never due, and kept by ``schedule_put`` while
its definition is unchanged (a changed definition starts enabled from its next fire)."""
MIN_EVERY_S = 1.0
_DST_MARGIN = timedelta(hours=4)


# --- time arithmetic -------------------------------------------------------------------------


def _gap_end(lo: datetime, hi: datetime, tz: ZoneInfo) -> datetime:
    """First UTC instant in (lo, hi] with hi's UTC offset: where a spring-forward gap ends."""
    target = hi.astimezone(tz).utcoffset()
    a, b = int(lo.timestamp()), int(hi.timestamp())
    while b - a > 1:
        mid = (a + b) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == target:
            b = mid
        else:
            a = mid
    return datetime.fromtimestamp(b, UTC)


def _instants(wall: datetime, tz: ZoneInfo, every_hour: bool) -> list[datetime]:
    """The UTC instants at which the naive local time ``wall`` fires."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if first.astimezone(tz).replace(tzinfo=None) != wall:
        # In a spring-forward gap: the time never shows on a clock; fire when the gap ends.
        lo, hi = min(first, second), max(first, second)
        return [_gap_end(lo, hi, tz)]
    # Shown twice (fall-back): fold=0 is the first occurrence.
    return [first, second] if every_hour else [first]


def cron_next(expr: str, tz: ZoneInfo, after: datetime) -> datetime:
    """The first fire time of ``expr`` (wall clock in ``tz``) strictly after ``after`` (UTC)."""
    from croniter import croniter

    every_hour = croniter(expr).expanded[1] in (["*"], list(range(24)))
    wall_after = after.astimezone(tz).replace(tzinfo=None)
    it = croniter(expr, wall_after - _DST_MARGIN)
    best: datetime | None = None
    best_wall: datetime | None = None
    for _ in range(100_000):
        wall: datetime = it.get_next(datetime)
        if best_wall is not None and wall > best_wall + _DST_MARGIN:
            break
        for inst in _instants(wall, tz, every_hour):
            if inst > after and (best is None or inst < best):
                best, best_wall = inst, wall
    if best is None:
        raise InvalidRequest(f"cron expression {expr!r} never fires")
    return best


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


# --- the schedule ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic schedule: which task to enqueue, when, and with what.

    Exactly one of ``cron`` (5-field cron expression, wall clock in ``tz``) and ``every``
    (seconds) is given. ``priority``, ``max_retries`` and ``timeout`` default to the task's own
    (``@app.task``) when the worker knows it. ``expires`` (seconds) ends a fire ``expired`` if no
    worker starts it in time. ``grace`` is how late a fire may still run (seconds).
    """

    name: str
    task: str
    queue: str = "default"
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    overlap: bool = True
    grace: float = DEFAULT_GRACE_S
    priority: int | None = None
    max_retries: int | None = None
    timeout: float | None = None
    expires: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str = "runtime"
    """``code`` for ``@app.periodic`` declarations (kept in step with the code by the workers),
    ``runtime`` for :func:`add_schedule` (kept until removed)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise InvalidRequest("schedule name must be a string of 1 to 200 characters")
        if CONTROL_RE.search(self.name):
            raise InvalidRequest(f"schedule name {self.name!r} holds control characters")
        if not isinstance(self.task, str) or not self.task:
            raise InvalidRequest("schedule needs a task name")
        check_task_name(self.task)
        if not isinstance(self.queue, str) or not QUEUE_NAME_RE.fullmatch(self.queue):
            raise InvalidRequest(f"bad queue name {self.queue!r}")
        if (self.cron is None) == (self.every is None):
            raise InvalidRequest("give exactly one of cron= and every=")
        if self.every is not None and (
            isinstance(self.every, bool)
            or not isinstance(self.every, int | float)
            or not math.isfinite(self.every)
            or not MIN_EVERY_S <= self.every <= MAX_SPAN_S
        ):
            raise InvalidRequest(
                f"every must be a number of seconds from {MIN_EVERY_S:g} to at most {MAX_SPAN_S}"
            )
        if self.cron is not None:
            if not isinstance(self.cron, str) or (
                len(self.cron.split()) != 5 and not self.cron.startswith("@")
            ):
                raise InvalidRequest(f"cron must have 5 fields: {self.cron!r}")
            from croniter import croniter
            from croniter.croniter import CroniterBadCronError

            try:
                croniter(self.cron)
            except (CroniterBadCronError, ValueError, KeyError) as exc:
                raise InvalidRequest(f"bad cron expression {self.cron!r}: {exc}") from None
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidRequest(f"unknown time zone {self.tz!r}") from None
        if not isinstance(self.grace, int | float) or not 0 <= self.grace <= 86_400:
            raise InvalidRequest("grace must be 0 to 86400 seconds")
        if self.expires is not None and not self.expires > 0:
            raise InvalidRequest("expires must be positive")
        if self.source not in ("code", "runtime"):
            raise InvalidRequest("source must be 'code' or 'runtime'")
        codec.dumps(list(self.args), "schedule args")
        codec.dumps(dict(self.kwargs), "schedule kwargs")
        codec.dumps(dict(self.metadata), "schedule metadata")
        if self.cron is not None:
            from croniter.croniter import CroniterBadDateError

            try:
                self.next_after(_ms(datetime.now(UTC)))
            except CroniterBadDateError:
                raise InvalidRequest(f"cron expression {self.cron!r} never fires") from None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_after(self, after_ms: int) -> int:
        """The first fire time (ms since the epoch) strictly after ``after_ms``."""
        if self.every is not None:
            step = round(self.every * 1000)
            return (after_ms // step + 1) * step
        assert self.cron is not None
        return _ms(cron_next(self.cron, self.zone, _dt(after_ms)))

    def latest_in(self, lo_ms: int, hi_ms: int) -> int | None:
        """The last fire time in ``[lo_ms, hi_ms]``, or None."""
        if self.every is not None:
            step = round(self.every * 1000)
            last = hi_ms // step * step
            return last if last >= lo_ms else None
        t = self.next_after(lo_ms - 1)
        if t > hi_ms:
            return None
        while (n := self.next_after(t)) <= hi_ms:
            t = n
        return t

    def to_json(self) -> str:
        """The stored definition: canonical JSON (sorted keys), compared byte for byte."""
        d = asdict(self)
        d["args"] = list(self.args)
        d["kwargs"] = dict(self.kwargs)
        d["metadata"] = dict(self.metadata)
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Schedule:
        d = json.loads(raw)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored schedule with its next fire time and the id of the last task it enqueued."""

    schedule: Schedule
    next_fire_at: datetime | None
    last_task_id: str | None
    enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as ``dtq schedules --json`` and ``GET /api/v1/schedules`` show it."""
        s = self.schedule
        return {
            "name": s.name,
            "queue": s.queue,
            "task": s.task,
            "cron": s.cron,
            "every": s.every,
            "tz": s.tz,
            "args": list(s.args),
            "kwargs": dict(s.kwargs),
            "overlap": s.overlap,
            "grace": s.grace,
            "priority": s.priority,
            "max_retries": s.max_retries,
            "timeout": s.timeout,
            "expires": s.expires,
            "metadata": dict(s.metadata),
            "source": s.source,
            "next_fire_at": self.next_fire_at.isoformat() if self.next_fire_at else None,
            "last_task_id": self.last_task_id,
            "enabled": self.enabled,
        }


# --- declaring schedules in code -------------------------------------------------------------

_declared: weakref.WeakKeyDictionary[App, dict[tuple[str, str], Schedule]] = (
    weakref.WeakKeyDictionary()
)


def declared(app: App) -> list[Schedule]:
    """The schedules declared in code on ``app`` with ``@app.periodic``."""
    return list(_declared.get(app, {}).values())


def periodic(
    app: App,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str = "UTC",
    name: str | None = None,
    queue: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    overlap: bool = True,
    grace: float = DEFAULT_GRACE_S,
    priority: int | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    expires: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Callable[[Any], Task[Any, Any]]:
    """Decorator behind ``App.periodic``: registers the function as a task (unless it already is
    one) and declares its schedule. The schedule's name defaults to the task's name."""
    from dtq.app import Task

    if isinstance(every, timedelta):
        every = every.total_seconds()

    def decorate(fn: Any) -> Task[Any, Any]:
        task: Task[Any, Any] = (
            fn if isinstance(fn, Task) else app.task(queue=queue or "default")(fn)
        )
        s = Schedule(
            name=name or task.name,
            task=task.name,
            queue=queue or task.defaults.queue,
            cron=cron,
            every=every,
            tz=tz,
            args=list(args),
            kwargs=dict(kwargs or {}),
            overlap=overlap,
            grace=grace,
            priority=priority,
            max_retries=max_retries,
            timeout=timeout,
            expires=expires,
            metadata=dict(metadata or {}),
            source="code",
        )
        registry = _declared.setdefault(app, {})
        if (s.queue, s.name) in registry:
            raise InvalidRequest(f"schedule {s.name!r} is declared twice in queue {s.queue!r}")
        registry[(s.queue, s.name)] = s
        return task

    return decorate


# --- the SDK: list, add, remove --------------------------------------------------------------


def _put_call(qk: QueueKeys, s: Schedule, next_ms: int) -> sc.Call:
    return sc.Call(
        "schedule_put", [qk.schedules, qk.schedules_next], [s.name, s.to_json(), next_ms]
    )


def _infos(
    queue: str, names: list[str], specs: list[Any], nexts: list[Any], lasts: list[Any]
) -> list[ScheduleInfo]:
    out = []
    for name, spec, nxt, last in zip(names, specs, nexts, lasts, strict=True):
        if spec is None:
            continue
        try:
            s = Schedule.from_json(spec)
        except (InvalidRequest, ValueError, TypeError) as exc:
            log.warning("schedule %s in queue %s is unreadable: %s", name, queue, exc)
            continue
        enabled = nxt is None or float(nxt) != DISABLED
        out.append(
            ScheduleInfo(
                s,
                ms_to_datetime(nxt) if enabled else None,  # None if unreadable: still listed
                make_task_id(queue, last) if last else None,
                enabled,
            )
        )
    return out


def _sorted(infos: list[ScheduleInfo]) -> list[ScheduleInfo]:
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(infos, key=lambda i: (i.next_fire_at or far, i.schedule.queue, i.schedule.name))


def list_schedules(client: Client, queue: str | None = None) -> list[ScheduleInfo]:
    """Every stored schedule (of one queue, or of all known queues), soonest fire first."""
    found: Any = [queue] if queue else client.redis.smembers(client.keys.queues)
    queues: list[str] = sorted(found)
    out: list[ScheduleInfo] = []
    for q in queues:
        qk = client.keys.queue(q)
        specs: dict[str, str] = client.redis.hgetall(qk.schedules)  # type: ignore[assignment]
        if not specs:
            continue
        names = sorted(specs)
        with client.redis.pipeline(transaction=False) as pipe:
            for n in names:
                pipe.zscore(qk.schedules_next, n)
            pipe.hmget(qk.schedules_last, names)
            replies = pipe.execute()
        out += _infos(q, names, [specs[n] for n in names], replies[:-1], replies[-1])
    return _sorted(out)


async def alist_schedules(client: AsyncClient, queue: str | None = None) -> list[ScheduleInfo]:
    """:func:`list_schedules` for asyncio."""
    found: Any = [queue] if queue else await client.redis.smembers(client.keys.queues)  # type: ignore[misc]
    queues: list[str] = sorted(found)
    out: list[ScheduleInfo] = []
    for q in queues:
        qk = client.keys.queue(q)
        specs: dict[str, str] = await client.redis.hgetall(qk.schedules)  # type: ignore[misc,assignment]
        if not specs:
            continue
        names = sorted(specs)
        async with client.redis.pipeline(transaction=False) as pipe:
            for n in names:
                pipe.zscore(qk.schedules_next, n)
            pipe.hmget(qk.schedules_last, names)
            replies = await pipe.execute()
        out += _infos(q, names, [specs[n] for n in names], replies[:-1], replies[-1])
    return _sorted(out)


def add_schedule(client: Client, schedule: Schedule) -> ScheduleInfo:
    """Store (create or replace) a schedule at run time; it fires from its next fire time on.

    A schedule with the same queue and name is replaced. Returns the stored schedule.
    """
    s = replace(schedule, source="runtime") if schedule.source != "runtime" else schedule
    qk = client.keys.queue(s.queue)
    now = _server_ms(client.redis.time())  # type: ignore[arg-type]
    nxt = s.next_after(now)
    client.redis.sadd(client.keys.queues, s.queue)
    client._scripts.run(_put_call(qk, s, nxt))
    return ScheduleInfo(s, _dt(nxt), None)


async def aadd_schedule(client: AsyncClient, schedule: Schedule) -> ScheduleInfo:
    """:func:`add_schedule` for asyncio."""
    s = replace(schedule, source="runtime") if schedule.source != "runtime" else schedule
    qk = client.keys.queue(s.queue)
    now = _server_ms(await client.redis.time())
    nxt = s.next_after(now)
    await client.redis.sadd(client.keys.queues, s.queue)  # type: ignore[misc]
    await client._scripts.run(_put_call(qk, s, nxt))
    return ScheduleInfo(s, _dt(nxt), None)


def remove_schedule(client: Client, name: str, queue: str = "default") -> bool:
    """Delete a schedule; True if it existed. Tasks it already enqueued are not touched.

    A schedule declared in code comes back when a worker running that code leads the queue:
    remove it from the code instead.
    """
    qk = client.keys.queue(queue)
    with client.redis.pipeline(transaction=True) as pipe:
        pipe.hdel(qk.schedules, name)
        pipe.zrem(qk.schedules_next, name)
        pipe.hdel(qk.schedules_last, name)
        return int(pipe.execute()[0]) == 1


async def aremove_schedule(client: AsyncClient, name: str, queue: str = "default") -> bool:
    """:func:`remove_schedule` for asyncio."""
    qk = client.keys.queue(queue)
    async with client.redis.pipeline(transaction=True) as pipe:
        pipe.hdel(qk.schedules, name)
        pipe.zrem(qk.schedules_next, name)
        pipe.hdel(qk.schedules_last, name)
        return int((await pipe.execute())[0]) == 1


class UnknownSchedule(DtqError, LookupError):
    """No schedule of that name in that queue."""


async def _astored(client: AsyncClient, name: str, queue: str) -> Schedule:
    spec: str | None = await client.redis.hget(client.keys.queue(queue).schedules, name)  # type: ignore[misc,assignment]
    if spec is None:
        raise UnknownSchedule(f"no schedule {name!r} in queue {queue!r}")
    return Schedule.from_json(spec)


async def aset_enabled(
    client: AsyncClient, name: str, queue: str, enabled: bool
) -> tuple[bool, ScheduleInfo]:
    """Disable a schedule (it stops firing, its definition kept) or enable it again (it fires
    from its next fire time after now); returns whether it changed and the schedule.

    One atomic ``ZADD``: disabling sets its next fire to +inf (XX: only a stored schedule);
    enabling sets the next fire time only where it is lower (LT), so an enabled schedule
    keeps its own.
    """
    s = await _astored(client, name, queue)
    qk = client.keys.queue(queue)
    if enabled:
        nxt = s.next_after(_server_ms(await client.redis.time()))
        changed = await client.redis.zadd(qk.schedules_next, {name: nxt}, xx=True, lt=True, ch=True)
    else:
        changed = await client.redis.zadd(qk.schedules_next, {name: DISABLED}, xx=True, ch=True)
    [info] = [i for i in await alist_schedules(client, queue) if i.schedule.name == name] or [
        ScheduleInfo(s, None, None, enabled)
    ]
    return bool(changed), info


async def arun_now(client: AsyncClient, name: str, queue: str) -> str:
    """Enqueue the schedule's task now, as a fire would (its metadata names the schedule);
    the schedule's own fire times do not move. Returns the task id."""
    s = await _astored(client, name, queue)
    meta = {**s.metadata, "schedule": s.name, "run_now": True}
    h = await client.enqueue(
        s.task, list(s.args), dict(s.kwargs) or None, queue=s.queue, priority=s.priority,
        max_retries=s.max_retries, timeout=s.timeout, expires=s.expires, metadata=meta,
    )  # fmt: skip
    return h.id


def _server_ms(t: tuple[int, int] | Sequence[Any]) -> int:
    return int(t[0]) * 1000 + int(t[1]) // 1000


# --- firing (run by the worker's scheduler leader) -------------------------------------------


@dataclass(frozen=True, slots=True)
class FireResult:
    outcome: str  # fired | overlap | missed | stale
    task_id: str | None


def fire_call(
    qk: QueueKeys,
    s: Schedule,
    spec: str,
    expected_ms: int,
    next_ms: int,
    fire_ms: int | None,
    task: sc.NewTask,
    events_maxlen: int,
) -> sc.Call:
    return sc.Call(
        "schedule_fire",
        [*qk.streams, qk.events, qk.task_base, qk.schedules, qk.schedules_next, qk.schedules_last],
        [
            s.name, expected_ms, next_ms, spec, 0 if fire_ms is None else 1,
            1 if s.overlap else 0, events_maxlen, fire_ms or expected_ms,
            task.tid, task.name, task.args, task.kwargs, task.priority, task.maxr_arg(),
            "" if task.timeout is None else repr(float(task.timeout)), task.expires_ms, task.meta,
            task.limit,
        ],
    )  # fmt: skip


class ScheduleRunner:
    """Fires the due schedules of a queue; called from the scheduler leader's tick.

    Also keeps the code-declared schedules of ``app`` in step with Redis: new or changed ones
    are stored, ones the code no longer declares are removed (runtime ones are never touched).
    """

    SYNC_EVERY_S = 30.0
    BATCH = 100

    def __init__(
        self, redis: AsyncRedis, scripts: sc.AsyncScripts, keys: Keys, settings: Settings, app: App
    ) -> None:
        self.redis = redis
        self.scripts = scripts
        self.keys = keys
        self.settings = settings
        self.app = app
        self._next_sync: dict[str, float] = {}

    async def now_ms(self) -> int:
        return _server_ms(await self.redis.time())

    async def sync(self, queue: str, now: int) -> None:
        qk = self.keys.queue(queue)
        mine = {s.name: s for s in declared(self.app) if s.queue == queue}
        for s in mine.values():
            if await self.scripts.run(_put_call(qk, s, s.next_after(now))):
                log.info("schedule %s of queue %s stored from code", s.name, queue)
        stored: dict[str, str] = await self.redis.hgetall(qk.schedules)  # type: ignore[misc,assignment]
        for name, spec in stored.items():
            if name in mine:
                continue
            try:
                is_code = json.loads(spec).get("source") == "code"
            except ValueError:
                is_code = False
            if is_code:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hdel(qk.schedules, name)
                    pipe.zrem(qk.schedules_next, name)
                    pipe.hdel(qk.schedules_last, name)
                    await pipe.execute()
                log.info("schedule %s of queue %s removed: no longer declared in code", name, queue)

    async def tick(self, queue: str) -> int | None:
        """Fire what is due in ``queue``; return the next fire time (ms), or None."""
        qk = self.keys.queue(queue)
        now = await self.now_ms()
        if time.monotonic() >= self._next_sync.get(queue, 0.0):
            await self.sync(queue, now)
            self._next_sync[queue] = time.monotonic() + self.SYNC_EVERY_S
        due: Any = await self.redis.zrange(
            qk.schedules_next, "-inf", now, byscore=True, offset=0, num=self.BATCH, withscores=True
        )
        if due:
            names = [n for n, _ in due]
            specs: Any = await self.redis.hmget(qk.schedules, names)  # type: ignore[misc]
            for (name, score), spec in zip(due, specs, strict=True):
                await self.fire_one(qk, name, int(score), spec, now)
        first: Any = await self.redis.zrange(
            qk.schedules_next, "-inf", "(inf", byscore=True, offset=0, num=1, withscores=True
        )  # a disabled schedule (score inf) is never next
        return int(first[0][1]) if first else None

    async def fire_one(
        self, qk: QueueKeys, name: str, expected: int, spec: str | None, now: int
    ) -> FireResult:
        if spec is None:
            await self.redis.zrem(qk.schedules_next, name)
            return FireResult("stale", None)
        try:
            s = Schedule.from_json(spec)
            lo = max(expected, now - int(s.grace * 1000))
            # The stored next fire time is authoritative; a later one in the window replaces it.
            fire_ms = s.latest_in(lo, now) or (expected if expected == lo else None)
            next_ms = s.next_after(now)
            task = self._task(s, fire_ms or expected)
        except Exception as exc:
            # A definition that cannot fire (bad JSON, task arguments refused): retry in a
            # minute rather than spin or stop the scheduler.
            log.error("schedule %s of queue %s cannot fire: %s", name, qk.queue, exc)
            await self.redis.zadd(qk.schedules_next, {name: now + 60_000}, xx=True)
            return FireResult("stale", None)
        call = fire_call(qk, s, spec, expected, next_ms, fire_ms, task, self.settings.events_maxlen)
        raw = await self.scripts.run(call)
        outcome, tid = sc.parse_strings(raw)
        task_id = make_task_id(qk.queue, tid) if tid else None
        if outcome == "fired":
            log.info("schedule %s fired %s (due %s)", name, task_id, _dt(fire_ms or expected))
        elif outcome == "overlap":
            log.info("schedule %s skipped a fire: previous run %s still active", name, task_id)
        elif outcome == "missed":
            log.warning("schedule %s skipped missed fire(s) from %s (past the %gs grace)",
                        name, _dt(expected), s.grace)  # fmt: skip
        return FireResult(outcome, task_id)

    def _task(self, s: Schedule, fire_ms: int) -> sc.NewTask:
        meta = {**s.metadata, "schedule": s.name, "fire_at": _dt(fire_ms).isoformat()}
        defaults = self.app.defaults_for(s.task) or TaskDefaults(queue=s.queue)
        _, task = build_task(
            self.settings, s.task, list(s.args), dict(s.kwargs) or None,
            defaults=defaults, queue=s.queue, priority=s.priority, max_retries=s.max_retries,
            timeout=s.timeout, expires=s.expires, metadata=meta,
        )  # fmt: skip
        return task
