"""The SDK's schedule operations: list, add, remove, enable or disable, run now."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.errors import InvalidRequest, UnknownSchedule
from dtq.keys import QueueKeys, make_task_id
from dtq.models import ms_to_datetime
from dtq.schedules.cron import from_ms
from dtq.schedules.model import DISABLED, Schedule, ScheduleInfo

if TYPE_CHECKING:
    from dtq.client import AsyncClient, Client

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
    now = server_ms(client.redis.time())  # type: ignore[arg-type]
    nxt = s.next_after(now)
    client.redis.sadd(client.keys.queues, s.queue)
    client._scripts.run(put_call(qk, s, nxt))
    return ScheduleInfo(s, from_ms(nxt), None)


async def aadd_schedule(client: AsyncClient, schedule: Schedule) -> ScheduleInfo:
    """:func:`add_schedule` for asyncio."""
    s = replace(schedule, source="runtime") if schedule.source != "runtime" else schedule
    qk = client.keys.queue(s.queue)
    now = server_ms(await client.redis.time())
    nxt = s.next_after(now)
    await client.redis.sadd(client.keys.queues, s.queue)  # type: ignore[misc]
    await client._scripts.run(put_call(qk, s, nxt))
    return ScheduleInfo(s, from_ms(nxt), None)


def forget(pipe: Any, qk: QueueKeys, name: str) -> None:
    """Queue on ``pipe`` (a transaction) the removal of schedule ``name``: its definition, its
    next fire time, its last task; the HDEL of the definition answers first."""
    pipe.hdel(qk.schedules, name)
    pipe.zrem(qk.schedules_next, name)
    pipe.hdel(qk.schedules_last, name)


def remove_schedule(client: Client, name: str, queue: str = "default") -> bool:
    """Delete a schedule; True if it existed. Tasks it already enqueued are not touched.

    A schedule declared in code comes back when a worker running that code leads the queue:
    remove it from the code instead.
    """
    qk = client.keys.queue(queue)
    with client.redis.pipeline(transaction=True) as pipe:
        forget(pipe, qk, name)
        return int(pipe.execute()[0]) == 1


async def aremove_schedule(client: AsyncClient, name: str, queue: str = "default") -> bool:
    """:func:`remove_schedule` for asyncio."""
    qk = client.keys.queue(queue)
    async with client.redis.pipeline(transaction=True) as pipe:
        forget(pipe, qk, name)
        return int((await pipe.execute())[0]) == 1


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
        nxt = s.next_after(server_ms(await client.redis.time()))
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


def server_ms(t: tuple[int, int] | Sequence[Any]) -> int:
    return int(t[0]) * 1000 + int(t[1]) // 1000
