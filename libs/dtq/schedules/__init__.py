"""Periodic schedules: cron expressions (time-zone and DST aware) and fixed intervals, declared
in code with ``@app.periodic(...)`` or added at run time with :func:`add_schedule`, stored per
queue and fired by the queue's scheduler leader, each fire one atomic script call
(``lua/schedule_fire.lua``). The rules (grace, ``overlap=False``, DST, ``every=N``):
docs/lifecycle.md.
"""

from __future__ import annotations

from dtq.errors import UnknownSchedule
from dtq.schedules.cron import cron_next
from dtq.schedules.model import (
    DEFAULT_GRACE_S,
    DISABLED,
    MIN_EVERY_S,
    Schedule,
    ScheduleInfo,
    declared,
    periodic,
)
from dtq.schedules.ops import (
    aadd_schedule,
    add_schedule,
    alist_schedules,
    aremove_schedule,
    arun_now,
    aset_enabled,
    list_schedules,
    remove_schedule,
)
from dtq.schedules.runner import FireResult, ScheduleRunner

__all__ = [
    "DEFAULT_GRACE_S",
    "DISABLED",
    "MIN_EVERY_S",
    "FireResult",
    "Schedule",
    "ScheduleInfo",
    "ScheduleRunner",
    "UnknownSchedule",
    "aadd_schedule",
    "add_schedule",
    "alist_schedules",
    "aremove_schedule",
    "arun_now",
    "aset_enabled",
    "cron_next",
    "declared",
    "list_schedules",
    "periodic",
    "remove_schedule",
]
