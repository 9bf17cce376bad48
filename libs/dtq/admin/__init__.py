"""Operator operations on a dtq deployment: the one implementation behind the CLI and the API.

Every atomic change is a Lua script (``lua/purge.lua``, ``lua/dlq_requeue.lua``,
``lua/dlq_discard.lua``; the cancel transition is the SDK's). The ``dtq`` CLI runs these
coroutines with :func:`asyncio.run`; ``dtq-api`` awaits them directly. Listings and bulk
operations do bounded work per request or script call (docs/operations.md).

:class:`Admin` is split by concern into mixins over :class:`AdminCore` (``core.py``: connection,
script runner, queue registry); ``views.py`` holds what they answer, ``common.py`` the bounds,
errors and checks.
"""

from __future__ import annotations

from dtq.admin.common import DLQ_BUDGET, RETRYABLE, SCAN_BUDGET
from dtq.admin.core import AdminCore
from dtq.admin.deadletters import DeadLetterOps
from dtq.admin.events import EventOps
from dtq.admin.queues import QueueOps
from dtq.admin.tasks import TaskOps
from dtq.admin.views import Event, Page, QueueInfo, WorkerInfo, filled_page
from dtq.errors import Conflict, UnknownQueue

__all__ = [
    "DLQ_BUDGET",
    "RETRYABLE",
    "SCAN_BUDGET",
    "Admin",
    "AdminCore",
    "Conflict",
    "Event",
    "Page",
    "QueueInfo",
    "UnknownQueue",
    "WorkerInfo",
    "filled_page",
]


class Admin(QueueOps, TaskOps, DeadLetterOps, EventOps):
    """Operator operations. ``async with Admin(settings) as a: ...`` closes its connection."""
