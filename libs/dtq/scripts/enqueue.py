"""enqueue.lua's wrapper: the tasks to create (:class:`NewTask`), the call, and what each
enqueue answered (:class:`Enqueued`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dtq.scripts.runner import Call, to_str
from dtq.store.keys import QueueKeys


@dataclass(slots=True)
class NewTask:
    """One task to create, already validated and encoded (not frozen: made once per enqueue,
    and a frozen dataclass's __init__ costs three times as much)."""

    tid: str
    name: str
    args: str
    kwargs: str
    priority: int
    max_retries: int  # dtq's default when left to the worker's declaration ("m" in unset)
    timeout: float | None
    delay_ms: int
    expires_ms: int
    idempotency_key: str
    meta: str
    limit: str = ""  # dtq.limits.Limit.encode(): "conc|count|window_ms|key", or ""
    unset: str = ""  # letters of what the enqueue left to the declaration (dtq.declared)
    headers: str = ""  # JSON object of strings from middleware (dtq.middleware), or ""
    group: str = ""  # the task's fair group within its queue (docs/groups.md), or ""

    def maxr_arg(self) -> int | str:
        """enqueue.lua's max_retries field: the number, or "~<unset letters><number>"."""
        return f"~{self.unset}{self.max_retries}" if self.unset else self.max_retries


@dataclass(frozen=True, slots=True)
class Enqueued:
    tid: str
    status: str
    created: bool


def enqueue_call(
    qk: QueueKeys,
    tasks: Sequence[NewTask],
    events_maxlen: int,
    *,
    hist_ttl_s: int = 0,
) -> Call:
    """``hist_ttl_s``: the history's retention (0: the tasks made are not counted, dtq.stats;
    else in this minute's counter, by this process's clock)."""
    if len(tasks) == 1:
        return enqueue_one_call(qk.prefix, qk.queue, tasks[0], events_maxlen, hist_ttl_s=hist_ttl_s)
    n = len(tasks)
    head, streams = _enqueue_keys(qk.prefix, qk.queue)
    hk, ha = _hist(head[4], hist_ttl_s)
    args: list[Any] = [events_maxlen, n, ha]
    grouped = False
    for t in tasks:  # plain tasks send their 5 fixed fields only (see enqueue.lua)
        if _has_options(t):
            args = [events_maxlen, n, ha]
            for t in tasks:
                args += _task_args(t)
            break
        grouped = grouped or bool(t.group)
        args += (t.tid, t.name, t.args, t.priority, t.maxr_arg() if t.unset else t.max_retries)
    else:
        if grouped:  # a group the only option: 6 fields each
            args = [events_maxlen, n, ha]
            for t in tasks:
                args += (t.tid, t.name, t.args, t.priority, t.maxr_arg(), t.group)
    # Only the bands used: enqueue.lua finds each stream by its last character.
    bands = (streams[p] for p in {t.priority for t in tasks})
    return Call("enqueue", [*head[:4], hk, *bands], args)


def enqueue_one_call(
    prefix: str,
    queue: str,
    t: NewTask,
    events_maxlen: int,
    *,
    hist_ttl_s: int = 0,
) -> Call:
    """:func:`enqueue_call` of one task, from the key prefix and queue name (the single
    enqueue's path: no QueueKeys is made, and the keys are looked up by two strings). A task
    without options sends only its 5 fixed fields (enqueue.lua reads the missing 8 as empty)."""
    head, streams = _enqueue_keys(prefix, queue)
    hk, ha = _hist(head[4], hist_ttl_s)
    mr = t.maxr_arg() if t.unset else t.max_retries
    if _has_options(t):
        args = [events_maxlen, 1, ha, *_task_args(t)]
    elif t.group:  # a group the only option: 6 fields
        args = [events_maxlen, 1, ha, t.tid, t.name, t.args, t.priority, mr, t.group]
    else:
        args = [events_maxlen, 1, ha, t.tid, t.name, t.args, t.priority, mr]
    return Call("enqueue", [*head[:4], hk, streams[t.priority]], args)


def _hist(base: str, ttl_s: int) -> tuple[str, int]:
    """enqueue.lua's history key and argument: this minute's enqueue counter (this process's
    clock) and its TTL, the retention and the minute; ``base`` and 0 count nothing."""
    if not ttl_s:
        return base, 0
    return f"{base}{int(time.time()) // 60}", ttl_s + 60


def _has_options(t: NewTask) -> bool:
    """Whether any of the 9 options of enqueue.lua's task fields but the group is set (a task
    whose only option is its group sends 6 fields: see enqueue.lua)."""
    return bool(
        t.kwargs or t.timeout is not None or t.delay_ms or t.expires_ms or t.idempotency_key
        or t.meta or t.limit or t.headers
    )  # fmt: skip


def _task_args(t: NewTask) -> list[Any]:
    """enqueue.lua's 14 fields of one task: the 5 fixed ones, then the 9 options."""
    return [
        t.tid, t.name, t.args, t.priority, t.maxr_arg(), t.kwargs,
        "" if t.timeout is None else repr(float(t.timeout)), t.delay_ms, t.expires_ms,
        t.idempotency_key, t.meta, t.limit, t.headers, t.group,
    ]  # fmt: skip


# Key lists of the hot-path scripts, built once per queue (each is ~15-18 formatted strings;
# bounded for clients that use many queue names).
@lru_cache(maxsize=512)
def _enqueue_keys(prefix: str, queue: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """enqueue.lua's fixed keys, and the stream of each band indexed by priority."""
    qk = QueueKeys(prefix, queue)
    head = (qk.sched, qk.events, qk.task_base, qk.idem_base, qk.hist_enq_base)
    return head, tuple(map(qk.stream, range(10)))


def parse_enqueue(raw: list[Any]) -> list[Enqueued]:
    return [
        Enqueued(to_str(raw[i]), to_str(raw[i + 1]), int(raw[i + 2]) == 1)
        for i in range(0, len(raw), 3)
    ]
