"""enqueue.lua's wrapper: the tasks to create (:class:`NewTask`), the call, and what each
enqueue answered (:class:`Enqueued`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
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


@dataclass(frozen=True, slots=True)
class Enqueued:
    tid: str
    status: str
    created: bool


# enqueue.lua's layout (its ARGV[4]): the fields each task sends. The 5 fixed ones come first;
# then only the options some task of the call has, in the order of OPTIONS.
FIXED = "tid name args prio maxr"
LIMIT = ("lk", "lc", "lrn", "lrw")  # a limit's key, concurrency, rate count, rate window (ms)
OPTIONS = ("dflt", "kwargs", "timeout", "delay", "exp", "idem", "meta", *LIMIT, "hdr", "grp")
BY_NAME = FIXED + " dflt"  # a by-name enqueue's, which enqueue.lua reads without parsing
_UNSET = {**dict.fromkeys(OPTIONS, ""), "delay": 0, "exp": 0}  # an option a task leaves out


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
    head, streams = _enqueue_keys(qk.prefix, qk.queue)
    hk, ha = _hist(head[4], hist_ttl_s)
    by_name = False
    for t in tasks:  # plain tasks send their 5 fixed fields only, by name 6 (see enqueue.lua)
        if t.group or _has_options(t):
            break
        by_name = by_name or bool(t.unset)
    else:
        args: list[Any] = [events_maxlen, len(tasks), ha, BY_NAME if by_name else FIXED]
        for t in tasks:
            args += (t.tid, t.name, t.args, t.priority, t.max_retries)
            if by_name:
                args.append(t.unset)
        return Call("enqueue", [*head[:4], hk, *_bands(streams, tasks)], args)
    opts = [_options(t) for t in tasks]
    used = [f for f in OPTIONS if any(f in o for o in opts)]
    args = [events_maxlen, len(tasks), ha, " ".join((FIXED, *used))]
    for t, o in zip(tasks, opts, strict=True):
        args += (t.tid, t.name, t.args, t.priority, t.max_retries)
        args += [o.get(f, _UNSET[f]) for f in used]
    return Call("enqueue", [*head[:4], hk, *_bands(streams, tasks)], args)


def _bands(streams: tuple[str, ...], tasks: Sequence[NewTask]) -> Iterator[str]:
    """Only the bands used: enqueue.lua finds each stream by its last character."""
    return (streams[p] for p in {t.priority for t in tasks})


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
    without options sends only its 5 fixed fields (and its dflt when by name)."""
    head, streams = _enqueue_keys(prefix, queue)
    hk, ha = _hist(head[4], hist_ttl_s)
    keys = [*head[:4], hk, streams[t.priority]]
    if t.group or _has_options(t):
        o = _options(t)
        layout = " ".join((FIXED, *o))
        args = [events_maxlen, 1, ha, layout, t.tid, t.name, t.args, t.priority, t.max_retries]
        args += o.values()
    elif t.unset:
        args = [events_maxlen, 1, ha, BY_NAME, t.tid, t.name, t.args, t.priority, t.max_retries]
        args.append(t.unset)
    else:
        args = [events_maxlen, 1, ha, FIXED, t.tid, t.name, t.args, t.priority, t.max_retries]
    return Call("enqueue", keys, args)


def _hist(base: str, ttl_s: int) -> tuple[str, int]:
    """enqueue.lua's history key and argument: this minute's enqueue counter (this process's
    clock) and its TTL, the retention and the minute; ``base`` and 0 count nothing."""
    if not ttl_s:
        return base, 0
    return f"{base}{int(time.time()) // 60}", ttl_s + 60


def _has_options(t: NewTask) -> bool:
    """Whether any option of enqueue.lua's layout but dflt and grp is set (the two a by-name or
    grouped enqueue sets: tested first, on their own)."""
    head = t.kwargs or t.timeout is not None or t.delay_ms or t.expires_ms or t.idempotency_key
    return bool(head or t.meta or t.limit or t.headers)


def _options(t: NewTask) -> dict[str, Any]:
    """The options task ``t`` sets, by their names in enqueue.lua's layout (in OPTIONS order)."""
    o: dict[str, Any] = {}
    if t.unset:
        o["dflt"] = t.unset
    if t.kwargs:
        o["kwargs"] = t.kwargs
    if t.timeout is not None:
        o["timeout"] = repr(float(t.timeout))
    if t.delay_ms:
        o["delay"] = t.delay_ms
    if t.expires_ms:
        o["exp"] = t.expires_ms
    if t.idempotency_key:
        o["idem"] = t.idempotency_key
    if t.meta:
        o["meta"] = t.meta
    if t.limit:
        # (dtq.limits.Limit.encode(): "concurrency|rate count|rate window ms|key")
        lc, lrn, lrw, o["lk"] = t.limit.split("|", 3)
        o["lc"], o["lrn"], o["lrw"] = lc, lrn, lrw
    if t.headers:
        o["hdr"] = t.headers
    if t.group:
        o["grp"] = t.group
    return o


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
