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
    from dtq.app import App
    from dtq.context import TaskContext, current_task
    from dtq.errors import (
        BadTaskId,
        BatchInterrupted,
        ConfigError,
        Conflict,
        DtqError,
        EvictingRedis,
        Fail,
        InvalidRequest,
        PayloadTooLarge,
        RedisUnavailable,
        Retry,
        SchemaMismatch,
        SerializationError,
        TaskFailed,
        UndeclaredTaskWarning,
        UnknownName,
        UnknownQueue,
        UnknownSchedule,
        UnknownTask,
    )
    from dtq.limits import Limit, Rate
    from dtq.models import TaskHandle, TaskInfo, TaskStatus
    from dtq.sdk.client import AsyncClient, Client
    from dtq.sdk.requests import EnqueueOptions
    from dtq.settings import Settings
    from dtq.task import Task
    from dtq.workflows import chain, chord, group, sig

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncClient",
    "BadTaskId",
    "BatchInterrupted",
    "Client",
    "ConfigError",
    "Conflict",
    "DtqError",
    "EnqueueOptions",
    "EvictingRedis",
    "Fail",
    "InvalidRequest",
    "Limit",
    "PayloadTooLarge",
    "Rate",
    "RedisUnavailable",
    "Retry",
    "SchemaMismatch",
    "SerializationError",
    "Settings",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "TaskInfo",
    "TaskStatus",
    "UndeclaredTaskWarning",
    "UnknownName",
    "UnknownQueue",
    "UnknownSchedule",
    "UnknownTask",
    "chain",
    "chord",
    "current_task",
    "group",
    "sig",
]

# Each public name and the module that defines it (the imports above say the same for type
# checkers; tests/sdk/test_lazy_import.py checks that the two agree with __all__).
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
