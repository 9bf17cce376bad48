"""Validating and encoding enqueue requests: shared by the sync and async clients and the API."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from dtq import codec
from dtq.errors import InvalidRequest, SerializationError
from dtq.limits import Limit
from dtq.scripts import NewTask
from dtq.settings import CONTROL_RE, Settings
from dtq.store import partitions
from dtq.store.keys import QUEUE_NAME_RE, new_tid
from dtq.store.record import DEFAULT_MAX_RETRIES as DEFAULT_MAX_RETRIES
from dtq.store.record import DEFAULT_PRIORITY as DEFAULT_PRIORITY


class EnqueueOptions(TypedDict, total=False):
    """The enqueue options, listed once. A client's ``enqueue(name, ...)`` and
    ``task.options(...)`` take them as keywords (``**options: Unpack[EnqueueOptions]``, so a
    type checker reads them from here); :func:`build_task` checks them; an ``enqueue_many``
    item and a ``POST /api/v1/tasks`` body carry them as fields (:data:`ENQUEUE_FIELDS`);
    workflow steps and schedules take the subsets :data:`dtq.workflows.STEP_OPTIONS` and
    :data:`SCHEDULE_OPTIONS`. tests/sdk/test_enqueue_options.py fails when one of those drifts
    from this list. ``None`` for any of them means "not given"."""

    queue: str | None
    priority: int | None
    delay: float | timedelta | None
    eta: datetime | str | None
    max_retries: int | None
    timeout: float | None
    idempotency_key: str | None
    expires: float | timedelta | datetime | None
    metadata: Mapping[str, Any] | None
    unique: bool | None
    partition_key: str | None
    group: str | None
    """The task's fair group within its queue (docs/groups.md)."""


ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__annotations__)
ENQUEUE_FIELDS = frozenset(("name", "args", "kwargs", *ENQUEUE_OPTIONS))
"""The fields of one enqueue request (an ``enqueue_many`` item, a ``POST /api/v1/tasks`` body)."""
SCHEDULE_OPTIONS = frozenset(
    ("queue", "priority", "max_retries", "timeout", "expires", "metadata", "group")
)
"""The enqueue options a schedule gives each task it fires (dtq.schedules.Schedule)."""


@dataclass(frozen=True, slots=True)
class TaskDefaults:
    """Per-task defaults declared with ``@app.task``."""

    queue: str = "default"
    priority: int = DEFAULT_PRIORITY
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout: float | None = None
    limit: Limit | None = None
    unique: bool = False
    expires: float | None = None
    """Seconds after its enqueue by which a run must have started, else it ends ``expired``."""


# The farthest a delay, eta, expiry or timeout may reach: every stored time stays a datetime
# (a year-9999 eta would fail every reader of the task and of its schedule).
MAX_SPAN_S = 10 * 365 * 86_400


def _seconds(value: float | timedelta | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{what} must be a number of seconds")
    if not -MAX_SPAN_S <= value <= MAX_SPAN_S:
        raise InvalidRequest(f"{what} must be at most {MAX_SPAN_S} seconds (10 years) from now")
    return float(value)


def _until(value: float | timedelta | datetime | str | None, what: str) -> float | None:
    """Seconds from now until ``value`` (a datetime, or seconds from now)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidRequest(f"{what} must be timezone-aware")
        return _seconds(value.timestamp() - time.time(), what)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidRequest(f"{what} must be an ISO 8601 datetime or seconds") from None
        return _until(when, what)
    return _seconds(value, what)


_DEFAULTS = TaskDefaults()
_queue_ok: set[str] = set()  # queue names already checked (bounded below)


def build_task(
    settings: Settings,
    name: str,
    args: Any = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    defaults: TaskDefaults | None = None,
    queue: str | None = None,
    priority: int | None = None,
    delay: float | timedelta | None = None,
    eta: datetime | str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    idempotency_key: str | None = None,
    expires: float | timedelta | datetime | None = None,
    metadata: Mapping[str, Any] | None = None,
    unique: bool | None = None,
    headers: Mapping[str, str] | None = None,
    partition_key: str | None = None,
    group: str | None = None,
) -> tuple[str, NewTask]:
    """Check one enqueue request; return its queue and the encoded task.

    On the enqueue hot path (one call per task, bulk included), so the usual request (a checked
    queue name, plain ints, options left out) is checked inline with ``is None`` and type tests;
    a given option, or a value that needs a closer look, goes to the step that checks it.
    """
    d = defaults or _DEFAULTS
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        _check_name(name)
    q = queue or d.queue
    if type(q) is not str or q not in _queue_ok:
        _check_queue(q)
    prio = d.priority if priority is None else priority
    if type(prio) is not int or not 0 <= prio <= 9:
        prio = _int_in(prio, 9, "priority must be an integer from 0 to 9")
    # A task this client does not know is governed by the worker's declaration where the
    # enqueue gave no value: the record says which it left unset (dtq/declared.py).
    unset = ""
    if defaults is None:
        if max_retries is None and timeout is None and expires is None:
            unset = "mte"  # a plain by-name enqueue
        else:
            unset = _unset(max_retries, timeout, expires)
    mr = d.max_retries if max_retries is None else max_retries
    if type(mr) is not int or mr < 0:
        mr = _int_in(mr, None, "max_retries must be a non-negative integer")
    to = d.timeout if timeout is None else _seconds(timeout, "timeout")
    if to is not None and to <= 0:
        raise InvalidRequest("timeout must be positive")
    delay_ms = 0 if delay is None and eta is None else _delay_ms(delay, eta)
    if expires is None:
        expires = d.expires
    expires_ms = 0 if expires is None else _expires_ms(expires)
    if idempotency_key is not None:
        _check_idempotency_key(idempotency_key)
    a, k = codec.encode_args(args, kwargs, settings.max_payload_bytes)
    if idempotency_key is None and (d.unique if unique is None else unique):
        idempotency_key = unique_key(name, a, kwargs)
    meta = _metadata(metadata) if metadata else ""
    lim = "" if d.limit is None else _limit_key(d.limit, name, args, kwargs)
    grp = "" if group is None else _group(group)
    parts = settings.queue_partitions
    if parts or partition_key is not None:
        q = _partition(q, parts.get(q, 1), partition_key, idempotency_key, lim, grp)
    hdrs = _headers(headers) if headers else ""
    head = (new_tid(), name, a, k, prio, mr, to, delay_ms, expires_ms, idempotency_key or "")
    return q, NewTask(*head, meta, lim, unset, headers=hdrs, group=grp)


# The steps of build_task, each called only when its check is needed.


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidRequest("task name must be a non-empty string of at most 200 characters")
    check_task_name(name)  # not printable: the precise checks


def _check_queue(q: object) -> None:
    """Check a queue name not seen before; remember it (up to 1,024 names) when good."""
    if not isinstance(q, str) or not QUEUE_NAME_RE.fullmatch(q):
        raise InvalidRequest(f"bad queue name {q!r}: use letters, digits, '_', '.', '-'")
    if len(_queue_ok) < 1024:
        _queue_ok.add(q)


def _int_in(value: Any, top: int | None, error: str) -> int:
    """``value`` as a plain int from 0 to ``top`` (an IntEnum, say: hiredis packs plain ints
    only); InvalidRequest(``error``) otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(error)
    n = int(value)
    if n < 0 or (top is not None and n > top):
        raise InvalidRequest(error)
    return n


def _unset(max_retries: object, timeout: object, expires: object) -> str:
    """Which of max_retries, timeout and expires a by-name enqueue left to the declaration."""
    return (
        ("m" if max_retries is None else "")
        + ("t" if timeout is None else "")
        + ("e" if expires is None else "")
    )


def _delay_ms(delay: float | timedelta | None, eta: datetime | str | None) -> int:
    if delay is not None and eta is not None:
        raise InvalidRequest("give delay or eta, not both")
    wait = _until(eta, "eta") if eta is not None else _seconds(delay, "delay")
    return max(0, math.ceil((wait or 0) * 1000))


def _expires_ms(expires: float | timedelta | datetime) -> int:
    exp = _until(expires, "expires")
    if exp is not None and exp <= 0:
        raise InvalidRequest("expires is already in the past")
    return 0 if exp is None else max(1, math.ceil(exp * 1000))


def _check_idempotency_key(key: object) -> None:
    if not isinstance(key, str) or not 0 < len(key) <= 256:
        raise InvalidRequest("idempotency_key must be a string of 1 to 256 characters")
    if key.startswith(UNIQUE_PREFIX):
        raise InvalidRequest(f"idempotency keys starting with {UNIQUE_PREFIX!r} are reserved")
    if not key.isascii():
        codec.utf8(key, "idempotency_key")


def _metadata(metadata: Mapping[str, Any]) -> str:
    meta = codec.dumps(dict(metadata), "metadata")
    if len(meta) > 4096:
        raise SerializationError("metadata must encode to at most 4096 bytes")
    return meta


def _limit_key(limit: Limit, name: str, args: Any, kwargs: Mapping[str, Any] | None) -> str:
    lim = limit.encode(name, args, kwargs)
    if not lim.isascii():
        codec.utf8(lim, "limit key")
    return lim


def _partition(q: str, n: int, key: object, idem: str | None, lim: str, group: str = "") -> str:
    """The partition of queue ``q`` (``n`` partitions) a task goes to (dtq.store.partitions): by its
    partition key, else its idempotency key (so a duplicate meets the first), else its limit
    (so one key's runs are counted in one place), else its fair group (so a group's turns and
    cap live in one partition), else round the partitions."""
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 256):
        raise InvalidRequest("partition_key must be a string of 1 to 256 characters")
    if n <= 1:
        return q
    return partitions.place(q, n, key if key is not None else idem or lim or group or None)


MAX_GROUP_CHARS = 128


def _group(group: object) -> str:
    """A given fair group as stored (``""``: none), or InvalidRequest saying what is wrong."""
    if type(group) is str and len(group) <= MAX_GROUP_CHARS and group.isprintable():
        return group  # the usual case: one test each (printable: no control character)
    check_group(group)
    return str(group)  # (a str subclass: plain, as hiredis packs it)


def check_group(group: object) -> None:
    """Refuse a fair group (docs/groups.md) that is not a string of 1 to 128 characters, or
    holds control or line-separator characters (a group is shown in CLI rows and log lines;
    the rule of task names and of the HTTP API's schema), or text that cannot be sent as UTF-8
    (a lone surrogate). ``None`` and ``""`` mean no group."""
    if group is None or group == "":
        return
    if not isinstance(group, str) or len(group) > MAX_GROUP_CHARS:
        raise InvalidRequest(f"group must be a string of 1 to {MAX_GROUP_CHARS} characters")
    check_text("group", group)


def check_task_name(name: str) -> None:
    """Refuse a task name with control characters (a newline forged log lines and CLI rows) or
    text that cannot be sent as UTF-8 (a lone surrogate)."""
    check_text("task name", name)


def check_text(what: str, text: str) -> None:
    """Refuse ``text`` (a ``what``) holding control characters or that cannot be sent as UTF-8."""
    if CONTROL_RE.search(text):
        raise InvalidRequest(f"{what} {text!r} holds control characters")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} {text!r} is not valid Unicode text") from None


def _headers(headers: Mapping[str, str]) -> str:
    """Middleware headers (dtq.middleware) as stored: a JSON object of strings."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidRequest("headers must map strings to strings")
    out = json.dumps(dict(headers), separators=(",", ":"))
    if len(out) > 4096:
        raise SerializationError("headers must encode to at most 4096 bytes")
    return out


UNIQUE_PREFIX = "~u:"


def unique_key(name: str, args_json: str, kwargs: Mapping[str, Any] | None) -> str:
    """The idempotency key of a unique task: a hash of its name and arguments.

    Keys with this prefix are released as soon as the task ends (see lua/includes/finish.lua).
    """
    kw = json.dumps(dict(kwargs or {}), sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256("\0".join((name, args_json, kw)).encode()).hexdigest()
    return f"{UNIQUE_PREFIX}{digest[:40]}"


def check_fields(item: Mapping[str, Any]) -> None:
    unknown = set(item) - ENQUEUE_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown enqueue field(s): {', '.join(sorted(unknown))}")
    if "name" not in item:
        raise InvalidRequest("each task needs a 'name'")
