"""The one error tree dtq raises on purpose, grouped by what a caller can do about it."""

from __future__ import annotations


class DtqError(Exception):
    """Root of every error dtq raises on purpose."""


class ConfigError(DtqError):
    """A setting is missing or invalid; the message names the setting and why."""


class EvictingRedis(ConfigError):
    """Redis's ``maxmemory-policy`` may evict waiting tasks (``allkeys-*``): dtq does not write
    there. The message names the policy and the fix (``noeviction``)."""


class SerializationError(DtqError, ValueError):
    """Arguments or a result are not JSON, or exceed the configured size limit."""


class PayloadTooLarge(SerializationError):
    """The encoded arguments exceed ``DTQ_MAX_PAYLOAD_BYTES``."""


class UnknownTask(DtqError, LookupError):
    """No task record exists for this id (never enqueued, or expired after its TTL)."""


class TaskFailed(DtqError):
    """Raised by ``result()`` when the task ended ``failed``, ``cancelled`` or ``expired``."""

    def __init__(self, task_id: str, status: str, error: str | None) -> None:
        super().__init__(f"task {task_id} ended {status}: {error or 'no error recorded'}")
        self.task_id = task_id
        self.status = status
        self.error = error


class SchemaMismatch(DtqError):
    """The Redis keyspace was written by an incompatible dtq version."""


class Retry(DtqError):
    """Raise inside a task to ask for a retry, optionally after ``delay`` seconds.

    The retry spends one attempt of the task's ``max_retries`` budget.
    """

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        super().__init__(reason or "retry requested")
        self.delay = delay


class Fail(DtqError):
    """Raise inside a task to end it ``failed`` at once, without retries."""


class UnknownName(Fail):
    """The claimed task's name is not registered on the worker that runs it (the run fails)."""


class RedisUnavailable(DtqError, ConnectionError):
    """Redis could not be reached (refused, reset, timed out); nothing was changed."""


class BatchInterrupted(DtqError):
    """The thread sending the batch this call's item went out in was interrupted (a
    ``KeyboardInterrupt`` or ``SystemExit`` there) while the batch was in flight: whether the
    batch reached Redis is unknown. ``Client.enqueue`` answers it by sending its task again
    alone (the same task id: made once either way)."""


def unreachable(exc: BaseException) -> str:
    """``Redis unreachable: <why>`` for a redis-py error, some of which say nothing (a full
    pool's ``MaxConnectionsError``): then its kind. Redis refusing the credentials (``NOAUTH``,
    ``WRONGPASS``: redis-py's ``AuthenticationError``) says so, and where they come from."""
    if any(c.__name__ == "AuthenticationError" for c in type(exc).__mro__):
        return f"Redis refused the credentials of DTQ_REDIS_URL (user, password): {describe(exc)}"
    return f"Redis unreachable: {describe(exc)}"


def describe(exc: BaseException) -> str:
    """What an error says, or its kind when it says nothing (a full pool's
    ``MaxConnectionsError``, a bare ``TimeoutError``): for logs and one-line errors."""
    return str(exc) or _SILENT.get(type(exc).__name__, type(exc).__name__)


_SILENT = {"MaxConnectionsError": "too many connections (every one of the client's is in use)"}


class InvalidRequest(DtqError, ValueError):
    """An enqueue or admin request has a bad field (unknown queue name form, priority, ...)."""


class BadTaskId(DtqError, ValueError):
    """A string that is not a dtq task id."""


class UnknownQueue(DtqError, LookupError):
    """No queue of that name has ever been used under this prefix."""


class UnknownSchedule(DtqError, LookupError):
    """No schedule of that name in that queue."""


class Conflict(DtqError):
    """The task is not in a state that allows the operation (e.g. retrying a running task)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class UndeclaredTaskWarning(UserWarning):
    """Issued (:mod:`warnings`) by a client's first enqueue BY NAME of a task no live worker of
    the queue declares, or to a queue no live worker consumes: such a task waits, and fails
    on the worker that takes it. Once per client, queue and name; a warning, not an error (a
    worker may simply start later). Off with ``DTQ_CLIENT_WARN_UNDECLARED=0``."""
