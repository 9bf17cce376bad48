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
    from dtq.sdk.client import AsyncClient, Client, Steps

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
        when = ms_to_datetime(nxt) if enabled else None  # None if unreadable: still listed
        out.append(ScheduleInfo(s, when, make_task_id(queue, last) if last else None, enabled))
    return out


# Each operation is written once, as a generator of its I/O steps (as in dtq.sdk.client), driven
# by the clients' methods (Client.add_schedule, ...); the functions below are what the docs show.


def _hgetall(key: str, r: Any) -> Any:
    return r.hgetall(key)


def _fire_times(qk: QueueKeys, names: list[str], r: Any) -> Any:
    """The next fire time of each of ``names``, then their last tasks (one HMGET)."""
    pipe = r.pipeline(transaction=False)
    for n in names:
        pipe.zscore(qk.schedules_next, n)
    pipe.hmget(qk.schedules_last, names)
    return pipe.execute()


def list_steps(keys: Keys, queue: str | None) -> Steps[list[ScheduleInfo]]:
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
    far = datetime.max.replace(tzinfo=UTC)  # (no next fire: listed last)
    return sorted(out, key=lambda i: (i.next_fire_at or far, i.schedule.queue, i.schedule.name))


def add_steps(keys: Keys, schedule: Schedule) -> Steps[ScheduleInfo]:
    s = replace(schedule, source="runtime") if schedule.source != "runtime" else schedule
    now = server_ms((yield lambda r: r.time()))
    nxt = s.next_after(now)
    yield lambda r: r.sadd(keys.queues, s.queue)
    yield put_call(keys.queue(s.queue), s, nxt)
    return ScheduleInfo(s, from_ms(nxt), None)


def forget(pipe: Any, qk: QueueKeys, name: str) -> None:
    """Queue on ``pipe`` (a transaction) the removal of schedule ``name``: its definition, its
    next fire time, its last task; the HDEL of the definition answers first."""
    pipe.hdel(qk.schedules, name)
    pipe.zrem(qk.schedules_next, name)
    pipe.hdel(qk.schedules_last, name)


def remove_steps(keys: Keys, name: str, queue: str) -> Steps[bool]:
    def remove(r: Any) -> Any:
        pipe = r.pipeline(transaction=True)
        forget(pipe, keys.queue(queue), name)
        return pipe.execute()

    replies = yield remove
    return int(replies[0]) == 1


def stored_steps(keys: Keys, name: str, queue: str) -> Steps[Schedule]:
    spec: str | None = yield lambda r: r.hget(keys.queue(queue).schedules, name)
    if spec is None:
        raise UnknownSchedule(f"no schedule {name!r} in queue {queue!r}")
    return Schedule.from_json(spec)


def set_enabled_steps(
    keys: Keys, name: str, queue: str, enabled: bool
) -> Steps[tuple[bool, ScheduleInfo]]:
    s = yield from stored_steps(keys, name, queue)
    qk = keys.queue(queue)
    if enabled:
        nxt = s.next_after(server_ms((yield lambda r: r.time())))
        changed = yield lambda r: r.zadd(qk.schedules_next, {name: nxt}, xx=True, lt=True, ch=True)
    else:
        changed = yield lambda r: r.zadd(qk.schedules_next, {name: DISABLED}, xx=True, ch=True)
    infos = yield from list_steps(keys, queue)
    [info] = [i for i in infos if i.schedule.name == name] or [ScheduleInfo(s, None, None, enabled)]
    return bool(changed), info


def run_now_request(s: Schedule) -> dict[str, Any]:
    """enqueue()'s arguments for a schedule's run now: as a fire would, its metadata naming it."""
    return s.request(run_now=True)


def list_schedules(client: Client, queue: str | None = None) -> list[ScheduleInfo]:
    """:meth:`Client.list_schedules <dtq.Client.list_schedules>`."""
    return client.list_schedules(queue)


async def alist_schedules(client: AsyncClient, queue: str | None = None) -> list[ScheduleInfo]:
    """:meth:`AsyncClient.list_schedules <dtq.AsyncClient.list_schedules>`."""
    return await client.list_schedules(queue)


def add_schedule(client: Client, schedule: Schedule) -> ScheduleInfo:
    """:meth:`Client.add_schedule <dtq.Client.add_schedule>`."""
    return client.add_schedule(schedule)


async def aadd_schedule(client: AsyncClient, schedule: Schedule) -> ScheduleInfo:
    """:meth:`AsyncClient.add_schedule <dtq.AsyncClient.add_schedule>`."""
    return await client.add_schedule(schedule)


def remove_schedule(client: Client, name: str, queue: str = "default") -> bool:
    """:meth:`Client.remove_schedule <dtq.Client.remove_schedule>`."""
    return client.remove_schedule(name, queue)


async def aremove_schedule(client: AsyncClient, name: str, queue: str = "default") -> bool:
    """:meth:`AsyncClient.remove_schedule <dtq.AsyncClient.remove_schedule>`."""
    return await client.remove_schedule(name, queue)


async def aset_enabled(
    client: AsyncClient, name: str, queue: str, enabled: bool
) -> tuple[bool, ScheduleInfo]:
    """:meth:`AsyncClient.set_schedule_enabled <dtq.AsyncClient.set_schedule_enabled>`."""
    return await client.set_schedule_enabled(name, queue, enabled)


async def arun_now(client: AsyncClient, name: str, queue: str) -> str:
    """:meth:`AsyncClient.run_schedule_now <dtq.AsyncClient.run_schedule_now>`."""
    return await client.run_schedule_now(name, queue)


def server_ms(t: tuple[int, int] | Sequence[Any]) -> int:
    return int(t[0]) * 1000 + int(t[1]) // 1000
