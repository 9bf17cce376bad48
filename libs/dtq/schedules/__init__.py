"""Periodic schedules: cron expressions (time-zone and DST aware) and fixed intervals, declared
in code with ``@app.periodic(...)`` or added at run time with :func:`add_schedule`, stored per
queue and fired by the queue's scheduler leader, each fire one atomic script call
(``lua/schedule_fire.lua``). The rules (grace, ``overlap=False``, DST, ``every=N``):
docs/lifecycle.md.
"""

from __future__ import annotations

from dtq.app import App
from dtq.errors import UnknownSchedule as UnknownSchedule
from dtq.schedules.cron import cron_next as cron_next
from dtq.schedules.model import Schedule as Schedule
from dtq.schedules.model import ScheduleInfo as ScheduleInfo
from dtq.schedules.model import declared as declared
from dtq.schedules.ops import aadd_schedule as aadd_schedule
from dtq.schedules.ops import add_schedule as add_schedule
from dtq.schedules.ops import alist_schedules as alist_schedules
from dtq.schedules.ops import aremove_schedule as aremove_schedule
from dtq.schedules.ops import arun_now as arun_now
from dtq.schedules.ops import aset_enabled as aset_enabled
from dtq.schedules.ops import list_schedules as list_schedules
from dtq.schedules.ops import remove_schedule as remove_schedule
from dtq.schedules.runner import ScheduleRunner as ScheduleRunner

periodic = App.periodic
"""``@app.periodic(...)`` as a function of the app: ``periodic(app, every=60)(fn)``."""
