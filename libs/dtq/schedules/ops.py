"""The SDK's schedule operations: list, add, remove, enable or disable, run now."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.errors import InvalidRequest, UnknownSchedule
from dtq.models import ms_to_datetime
from dtq.schedules.cron import from_ms
from dtq.schedules.model import DISABLED, Schedule, ScheduleInfo
from dtq.store.keys import Keys, QueueKeys, make_task_id

if TYPE_CHECKING:
    from dtq.sdk.client import AsyncClient, Client
    from dtq.sdk.clientbase import Steps

log = logging.getLogger("dtq.schedules")


def put_call(qk: QueueKeys, s: Schedule, next_ms: int) -> sc.Call:
    return sc.schedule_put_call(qk, s.name, s.to_json(), next_ms)


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


# Each operation is written once, as a generator of its I/O steps (dtq.sdk.clientbase: a script
# call, or a function of the Redis client); Client._drive and AsyncClient._drive do the I/O. So
# the twins differ only in I/O, and both raise what every SDK call raises: RedisUnavailable
# (one line) when Redis cannot be reached.


def _hgetall(key: str, r: Any) -> Any:
    return r.hgetall(key)


def _fire_times(qk: QueueKeys, names: list[str], r: Any) -> Any:
    """The next fire time of each of ``names``, then their last tasks (one HMGET)."""
    pipe = r.pipeline(transaction=False)
    for n in names:
        pipe.zscore(qk.schedules_next, n)
    pipe.hmget(qk.schedules_last, names)
    return pipe.execute()


def _list_steps(keys: Keys, queue: str | None) -> Steps[list[ScheduleInfo]]:
    found = [queue] if queue else (yield lambda r: r.smembers(keys.queues))
    out: list[ScheduleInfo] = []
    for q in sorted(found):
        qk = keys.queue(q)
        specs: dict[str, str] = yield partial(_hgetall, qk.schedules)
        if not specs:
            continue
        names = sorted(specs)
        replies = yield partial(_fire_times, qk, names)
        out += _infos(q, names, [specs[n] for n in names], replies[:-1], replies[-1])
    return _sorted(out)


def list_schedules(client: Client, queue: str | None = None) -> list[ScheduleInfo]:
    """Every stored schedule (of one queue, or of all known queues), soonest fire first."""
    return client._drive(_list_steps(client.keys, queue))


async def alist_schedules(client: AsyncClient, queue: str | None = None) -> list[ScheduleInfo]:
    """:func:`list_schedules` for asyncio."""
    return await client._drive(_list_steps(client.keys, queue))


def _add_steps(keys: Keys, schedule: Schedule) -> Steps[ScheduleInfo]:
    s = replace(schedule, source="runtime") if schedule.source != "runtime" else schedule
    now = server_ms((yield lambda r: r.time()))
    nxt = s.next_after(now)
    yield lambda r: r.sadd(keys.queues, s.queue)
    yield put_call(keys.queue(s.queue), s, nxt)
    return ScheduleInfo(s, from_ms(nxt), None)


def add_schedule(client: Client, schedule: Schedule) -> ScheduleInfo:
    """Store (create or replace) a schedule at run time; it fires from its next fire time on.

    A schedule with the same queue and name is replaced. Returns the stored schedule.
    """
    return client._drive(_add_steps(client.keys, schedule))


async def aadd_schedule(client: AsyncClient, schedule: Schedule) -> ScheduleInfo:
    """:func:`add_schedule` for asyncio."""
    return await client._drive(_add_steps(client.keys, schedule))


def forget(pipe: Any, qk: QueueKeys, name: str) -> None:
    """Queue on ``pipe`` (a transaction) the removal of schedule ``name``: its definition, its
    next fire time, its last task; the HDEL of the definition answers first."""
    pipe.hdel(qk.schedules, name)
    pipe.zrem(qk.schedules_next, name)
    pipe.hdel(qk.schedules_last, name)


def _remove_steps(keys: Keys, name: str, queue: str) -> Steps[bool]:
    def remove(r: Any) -> Any:
        pipe = r.pipeline(transaction=True)
        forget(pipe, keys.queue(queue), name)
        return pipe.execute()

    replies = yield remove
    return int(replies[0]) == 1


def remove_schedule(client: Client, name: str, queue: str = "default") -> bool:
    """Delete a schedule; True if it existed. Tasks it already enqueued are not touched.

    A schedule declared in code comes back while a worker running that code consumes the queue
    (it stores its schedules every 30 s): remove it from the code instead.
    """
    return client._drive(_remove_steps(client.keys, name, queue))


async def aremove_schedule(client: AsyncClient, name: str, queue: str = "default") -> bool:
    """:func:`remove_schedule` for asyncio."""
    return await client._drive(_remove_steps(client.keys, name, queue))


def _stored_steps(keys: Keys, name: str, queue: str) -> Steps[Schedule]:
    spec: str | None = yield lambda r: r.hget(keys.queue(queue).schedules, name)
    if spec is None:
        raise UnknownSchedule(f"no schedule {name!r} in queue {queue!r}")
    return Schedule.from_json(spec)


def _set_enabled_steps(keys: Keys, name: str, queue: str, enabled: bool) -> Steps[Any]:
    s = yield from _stored_steps(keys, name, queue)
    qk = keys.queue(queue)
    if enabled:
        nxt = s.next_after(server_ms((yield lambda r: r.time())))
        changed = yield lambda r: r.zadd(qk.schedules_next, {name: nxt}, xx=True, lt=True, ch=True)
    else:
        changed = yield lambda r: r.zadd(qk.schedules_next, {name: DISABLED}, xx=True, ch=True)
    infos = yield from _list_steps(keys, queue)
    [info] = [i for i in infos if i.schedule.name == name] or [ScheduleInfo(s, None, None, enabled)]
    return bool(changed), info


async def aset_enabled(
    client: AsyncClient, name: str, queue: str, enabled: bool
) -> tuple[bool, ScheduleInfo]:
    """Disable a schedule (it stops firing, its definition kept) or enable it again (it fires
    from its next fire time after now); returns whether it changed and the schedule.

    One atomic ``ZADD``: disabling sets its next fire to +inf (XX: only a stored schedule);
    enabling sets the next fire time only where it is lower (LT), so an enabled schedule
    keeps its own.
    """
    changed, info = await client._drive(_set_enabled_steps(client.keys, name, queue, enabled))
    return bool(changed), info


async def arun_now(client: AsyncClient, name: str, queue: str) -> str:
    """Enqueue the schedule's task now, as a fire would (its metadata names the schedule);
    the schedule's own fire times do not move. Returns the task id."""
    s = await client._drive(_stored_steps(client.keys, name, queue))
    meta = {**s.metadata, "schedule": s.name, "run_now": True}
    h = await client.enqueue(
        s.task, list(s.args), dict(s.kwargs) or None, queue=s.queue, priority=s.priority,
        max_retries=s.max_retries, timeout=s.timeout, expires=s.expires, metadata=meta,
        group=s.group,
    )  # fmt: skip
    return h.id


def server_ms(t: tuple[int, int] | Sequence[Any]) -> int:
    return int(t[0]) * 1000 + int(t[1]) // 1000
