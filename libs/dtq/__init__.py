"""dtq: a distributed task queue on Redis Streams.

At-least-once delivery; each attempt started exactly once across all workers; every outcome
write fenced by the attempt that claimed it.

The public names load on first use (PEP 562): ``import dtq``, or importing one of its
submodules (as the worker and the API do), runs none of the SDK's modules until a name is
asked for, so a process pays only for what it uses at start; type checkers read the imports
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtq.app import App as App
    from dtq.context import TaskContext as TaskContext
    from dtq.context import current_task as current_task
    from dtq.errors import BadTaskId as BadTaskId
    from dtq.errors import BatchInterrupted as BatchInterrupted
    from dtq.errors import ConfigError as ConfigError
    from dtq.errors import Conflict as Conflict
    from dtq.errors import DtqError as DtqError
    from dtq.errors import EvictingRedis as EvictingRedis
    from dtq.errors import Fail as Fail
    from dtq.errors import InvalidRequest as InvalidRequest
    from dtq.errors import PayloadTooLarge as PayloadTooLarge
    from dtq.errors import RedisUnavailable as RedisUnavailable
    from dtq.errors import Retry as Retry
    from dtq.errors import SchemaMismatch as SchemaMismatch
    from dtq.errors import SerializationError as SerializationError
    from dtq.errors import TaskFailed as TaskFailed
    from dtq.errors import UndeclaredTaskWarning as UndeclaredTaskWarning
    from dtq.errors import UnknownName as UnknownName
    from dtq.errors import UnknownQueue as UnknownQueue
    from dtq.errors import UnknownSchedule as UnknownSchedule
    from dtq.errors import UnknownTask as UnknownTask
    from dtq.limits import Limit as Limit
    from dtq.limits import Rate as Rate
    from dtq.models import TaskHandle as TaskHandle
    from dtq.models import TaskInfo as TaskInfo
    from dtq.models import TaskStatus as TaskStatus
    from dtq.sdk.client import AsyncClient as AsyncClient
    from dtq.sdk.client import Client as Client
    from dtq.sdk.requests import EnqueueOptions as EnqueueOptions
    from dtq.settings import Settings as Settings
    from dtq.task import Task as Task
    from dtq.workflows import chain as chain
    from dtq.workflows import chord as chord
    from dtq.workflows import group as group
    from dtq.workflows import sig as sig

__version__ = "0.1.0"

# Each public name and the module that defines it: the imports above (re-exports, as type
# checkers read them) say the same; tests/sdk/test_lazy_import.py checks that the two agree.
_HOMES: dict[str, str] = {
    "App": "dtq.app",
    **dict.fromkeys(("AsyncClient", "Client"), "dtq.sdk.client"),
    **dict.fromkeys(("TaskContext", "current_task"), "dtq.context"),
    **dict.fromkeys(
        (
            "BadTaskId",
            "BatchInterrupted",
            "ConfigError",
            "Conflict",
            "DtqError",
            "EvictingRedis",
            "Fail",
            "InvalidRequest",
            "PayloadTooLarge",
            "RedisUnavailable",
            "Retry",
            "SchemaMismatch",
            "SerializationError",
            "TaskFailed",
            "UndeclaredTaskWarning",
            "UnknownQueue",
            "UnknownSchedule",
            "UnknownName",
            "UnknownTask",
        ),
        "dtq.errors",
    ),
    **dict.fromkeys(("Limit", "Rate"), "dtq.limits"),
    **dict.fromkeys(("TaskHandle", "TaskInfo", "TaskStatus"), "dtq.models"),
    "Settings": "dtq.settings",
    "EnqueueOptions": "dtq.sdk.requests",
    "Task": "dtq.task",
    **dict.fromkeys(("chain", "chord", "group", "sig"), "dtq.workflows"),
}
__all__ = sorted(_HOMES)


# Hidden from type checkers, which would otherwise take any misspelt `dtq.X` for Any.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            # Also how `from dtq import codec` finds that a submodule is meant, and imports it.
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
