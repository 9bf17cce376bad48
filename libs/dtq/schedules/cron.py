"""Cron arithmetic, time-zone and DST aware (the rules are in :mod:`dtq.schedules`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dtq.errors import InvalidRequest

# croniter is imported where a cron expression is used: a worker without cron schedules (and
# every process that only enqueues) starts without it.

_DST_MARGIN = timedelta(hours=4)


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
        return [_gap_end(min(first, second), max(first, second), tz)]
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


def to_ms(dt: datetime) -> int:
    """Milliseconds since the epoch."""
    return round(dt.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    """The UTC datetime of milliseconds since the epoch."""
    return datetime.fromtimestamp(ms / 1000, UTC)
