"""dtq: a distributed task queue on Redis Streams.

At-least-once delivery; each attempt started exactly once across all workers; every outcome
write fenced by the attempt that claimed it.
"""

from dtq.app import App, EnqueueOptions, Task
from dtq.client import AsyncClient, Client
from dtq.context import TaskContext, current_task
from dtq.errors import (
    BadTaskId,
    ConfigError,
    Conflict,
    DtqError,
    Fail,
    InvalidRequest,
    PayloadTooLarge,
    RedisUnavailable,
    Retry,
    SchemaMismatch,
    SerializationError,
    TaskFailed,
    UnknownQueue,
    UnknownSchedule,
    UnknownTask,
)
from dtq.limits import Limit, Rate
from dtq.models import TaskHandle, TaskInfo, TaskStatus
from dtq.settings import Settings
from dtq.workflows import chain, chord, group, sig

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncClient",
    "BadTaskId",
    "Client",
    "ConfigError",
    "Conflict",
    "DtqError",
    "EnqueueOptions",
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
    "UnknownQueue",
    "UnknownSchedule",
    "UnknownTask",
    "chain",
    "chord",
    "current_task",
    "group",
    "sig",
]
