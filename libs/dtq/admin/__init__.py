"""Operator operations on a dtq deployment: the one implementation behind the CLI and the API.

Everything here reads or changes Redis through the key layout in :mod:`dtq.store.keys` and,
for every change that must be atomic, a Lua script (``lua/purge.lua``, ``lua/dlq_requeue.lua``,
``lua/dlq_discard.lua``; the cancel transition is the SDK's). The ``dtq`` CLI runs these
coroutines with :func:`asyncio.run`; ``dtq-api`` awaits them directly.

Costs worth knowing:

* :meth:`Admin.list_queues`: a fixed handful of pipelined commands per queue.
* :meth:`Admin.recent_tasks` (the API's list) reads the queues' event streams newest first
  (:mod:`dtq.admin.task_index`).
* :meth:`Admin.list_tasks` (the CLI's) walks task records with ``SCAN``: a page costs O(keys
  scanned), and as with any ``SCAN`` a task may appear twice across pages. ``failed`` or
  ``scheduled`` with a queue reads the dead-letter/schedule zsets instead.
* Purge and bulk requeue/discard run in bounded batches (one short script call each).

The package splits :class:`Admin` by concern; each part is a mixin over :class:`AdminCore`
(``core.py``: connection, script runner, queue registry): ``queues.py``, ``tasks.py``,
``deadletters.py``, ``workers.py``, ``schedules.py``, ``events.py``, ``history.py``,
``groups.py`` (a queue's fair groups, through the SDK's dtq.sdk.groupops). ``views.py``
holds what they answer, ``common.py`` the bounds, errors and checks.
"""

from __future__ import annotations

from dtq.admin.common import (
    BATCH,
    DLQ_BUDGET,
    HISTORY_SCAN,
    MAX_PAGE,
    RETRYABLE,
    SCAN_BUDGET,
    Progress,
)
from dtq.admin.core import AdminCore
from dtq.admin.deadletters import DeadLetterOps
from dtq.admin.events import EventOps
from dtq.admin.groups import GroupOps
from dtq.admin.history import HistoryOps
from dtq.admin.queues import QueueOps
from dtq.admin.schedules import ScheduleOps
from dtq.admin.tasks import TaskOps
from dtq.admin.views import (
    BulkResult,
    DeadLetter,
    Event,
    Page,
    QueueInfo,
    ScheduledTask,
    WorkerInfo,
    dumps,
    filled_page,
)
from dtq.admin.workers import WorkerOps
from dtq.errors import Conflict, UnknownQueue
from dtq.scripts.admin import (
    PurgeBatch,
    dlq_discard_call,
    dlq_requeue_call,
    parse_purge,
    purge_call,
)

__all__ = [
    "BATCH",
    "DLQ_BUDGET",
    "HISTORY_SCAN",
    "MAX_PAGE",
    "RETRYABLE",
    "SCAN_BUDGET",
    "Admin",
    "AdminCore",
    "BulkResult",
    "Conflict",
    "DeadLetter",
    "Event",
    "Page",
    "Progress",
    "PurgeBatch",
    "QueueInfo",
    "ScheduledTask",
    "UnknownQueue",
    "WorkerInfo",
    "dlq_discard_call",
    "dlq_requeue_call",
    "dumps",
    "filled_page",
    "parse_purge",
    "purge_call",
]


class Admin(
    QueueOps, GroupOps, TaskOps, DeadLetterOps, WorkerOps, ScheduleOps, EventOps, HistoryOps
):
    """Operator operations. ``async with Admin(settings) as a: ...`` closes its connection."""
