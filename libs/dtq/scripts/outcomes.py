"""The run transitions' wrappers: claim.lua (and recover.lua, which answers as it does),
complete.lua, fail.lua and requeue.lua. These are the hot path: the parsers read replies
positionally and make one object per run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any

from dtq.scripts.runner import Call, to_str
from dtq.store.keys import GROUP, QueueKeys


class ClaimState(StrEnum):
    """The second value of a claim reply (claim.lua, complete.lua's claim, recover.lua):
    ``{now_ms, <state>, ...}``."""

    OK = "ok"
    """The claim ran: its counts and runs follow."""
    PAUSED = "paused"
    """The queue is paused: nothing follows."""
    MISSING_STREAMS = "no_streams"
    """A priority stream is missing: the worker recreates the streams and the group."""


class Verdict(StrEnum):
    """fail.lua's and requeue.lua's answer per run: what the task became, or that the run's
    fence failed (``stale``). A re-send answers the status the record has now, whichever."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    STALE = "stale"
    """The run no longer holds the task (its fence failed): nothing was written."""
    UNKNOWN = "unknown"
    """requeue.lua's for a name the worker does not know and no live worker declared within
    the grace: nothing was written (the worker fails it)."""


def parse_verdicts(raw: list[Any]) -> list[Verdict]:
    """fail.lua's or requeue.lua's reply: one verdict per run, in order."""
    return [Verdict(to_str(x)) for x in raw]


@lru_cache(maxsize=512)
def _claim_keys(qk: QueueKeys) -> tuple[str, ...]:
    head = (*qk.streams, qk.paused, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.sched)
    return (*head, qk.lim_base, qk.fair, qk.decl, qk.flow_base, qk.flowq)


# --- claim -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run this worker now owns: (tid, attempt) is started exactly once."""

    queue: str
    tid: str
    eid: str
    attempt: int
    name: str
    args: str
    kwargs: str
    max_retries: int
    timeout: float | None
    retries: int
    interruptions: int
    enqueued_ms: int
    priority: int
    idempotency_key: str
    headers: str = ""
    """JSON object of strings set by middleware at enqueue (e.g. a W3C traceparent), or ""."""
    flags: str = ""
    """Which of idem, lk, error, flow, grp the record held when this run started (letters i, l,
    e, f, g; "-" for none; "" unknown): given back with the outcome, it spares complete.lua reading
    them (:class:`Success`)."""


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    now_ms: int
    runs: list[Claimed]
    absorbed: int = 0
    expired: int = 0
    paused: bool = False
    missing_streams: bool = False
    held: int = 0  # entries parked by a limit (dtq.limits); no attempt spent
    more: bool = False  # the scan budget ran out with slots free: claim again at once


def claim_call(
    qk: QueueKeys,
    worker_id: str,
    count: int,
    events_maxlen: int,
    ttl_s: int,
    fair: bool = False,
    group_cap: int = 0,
) -> Call:
    """``group_cap``: how many tasks of one fair group of the queue may run at once (0: no
    cap; DTQ_GROUP_CONCURRENCY)."""
    return Call(
        "claim",
        list(_claim_keys(qk)),
        [GROUP, worker_id, count, events_maxlen, ttl_s, qk.done_base, 1 if fair else 0, group_cap],
    )


RUN_FIELDS = 14
"""claim.lua's fields per started run, in this order: tid, eid, attempt, name, args, kwargs,
max_retries, timeout ('' = none), retries, interruptions, enqueued_ms, priority, flags
(:attr:`Claimed.flags`), idem. recover.lua and complete.lua's refill answer the same."""


def parse_claim(queue: str, raw: list[Any]) -> ClaimBatch:
    """claim.lua's reply (also the last element of complete.lua's when it claimed)."""
    now = int(raw[0])
    s = to_str
    state = s(raw[1])
    if state != "ok":
        if state == ClaimState.PAUSED:
            return ClaimBatch(now, [], paused=True)
        if state == ClaimState.MISSING_STREAMS:
            return ClaimBatch(now, [], missing_streams=True)
        raise ValueError(f"claim reply: unknown state {state!r}")
    absorbed, expired, n = int(raw[2]), int(raw[3]), int(raw[4])
    runs = []
    end = 5 + n * RUN_FIELDS
    for b in range(5, end, RUN_FIELDS):
        # The run's fields in claim.lua's order (RUN_FIELDS); one slice per run.
        tid, eid, at, name, args, kw, mr, to, rt, it, enq, pr, fl, idem = raw[b : b + RUN_FIELDS]
        runs.append(
            Claimed(  # (one call, no unpacking: the hottest parser of the worker)
                queue, s(tid), s(eid), int(at), s(name), s(args), s(kw), int(mr),
                float(to) if to else None, int(rt), int(it), int(enq), int(pr), s(idem), "",
                s(fl),
            )
        )  # fmt: skip
    held = int(raw[end]) if len(raw) > end else 0
    more = len(raw) > end + 1 and int(raw[end + 1]) == 1
    for h in range(end + 2, len(raw) - 1, 2):  # headers, only of the runs that have them
        k = int(raw[h])
        runs[k] = replace(runs[k], headers=s(raw[h + 1]))
    return ClaimBatch(now, runs, absorbed=absorbed, expired=expired, held=held, more=more)


# --- outcomes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class History:
    """What an outcome call adds to the history (dtq.stats): its retention, and per outcome
    (in order) its run's run-time bucket (``dtq.stats.bucket_of``; "" when not counted)."""

    ttl_s: int
    buckets: Sequence[int | str]


@dataclass(frozen=True, slots=True)
class Success:
    tid: str
    eid: str
    attempt: int
    status: str  # "succeeded" | "cancelled"
    payload: str  # result JSON, or the cancel reason
    priority: int | None = None
    """The run's band, and its :attr:`Claimed.flags`: with both (see :meth:`of`) the fence
    reads 3 fields of the record instead of 8; without (None, ""), all 8."""
    flags: str = ""

    @classmethod
    def of(cls, c: Claimed, status: str, payload: str) -> Success:
        """The outcome of run ``c``, carrying what its claim told of the record."""
        return cls(c.tid, c.eid, c.attempt, status, payload, c.priority, c.flags)


def complete_call(
    qk: QueueKeys,
    worker_id: str,
    outcomes: Sequence[Success],
    events_maxlen: int,
    ttl_s: int,
    claim: int = 0,
    fair: bool = False,
    hist: History | None = None,
    group_cap: int = 0,
) -> Call:
    """Store ``outcomes``; then, when ``claim`` > 0, claim up to that many runs (as claim.lua).
    With ``hist``, the stored ones are counted in the history (dtq.stats)."""
    head = [GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(outcomes), claim]
    args: list[Any] = [*head, 1 if fair else 0, group_cap]
    for o in outcomes:
        prio = o.priority if o.flags and o.priority is not None else ""
        args += [o.tid, o.eid, o.attempt, o.status, o.payload, prio, o.flags if prio != "" else ""]
    if hist is None:
        args.append(0)
        return Call("complete", list(_claim_keys(qk)), args)
    args.append(hist.ttl_s)
    args += hist.buckets
    return Call("complete", [*_claim_keys(qk), qk.hist_base], args)


def parse_complete(raw: list[Any]) -> list[bool]:
    """The fence's verdict per outcome (a claim reply that follows them is left out)."""
    return [int(x) == 1 for x in raw if not isinstance(x, list)]


def parse_complete_claim(queue: str, raw: list[Any]) -> tuple[list[bool], ClaimBatch | None]:
    """complete.lua's reply: verdicts, and the claim batch when the call claimed."""
    if raw and isinstance(raw[-1], list):
        return parse_complete(raw[:-1]), parse_claim(queue, raw[-1])
    return parse_complete(raw), None


@dataclass(frozen=True, slots=True)
class Failure:
    tid: str
    eid: str
    attempt: int
    error: str
    retry_delay_ms: int | None  # None: no retry allowed
    traceback: str = ""  # "": none (a kept one is removed: it belonged to an older failure)


def fail_call(
    qk: QueueKeys,
    worker_id: str,
    failures: Sequence[Failure],
    events_maxlen: int,
    ttl_s: int,
    hist: History | None = None,
) -> Call:
    """Store ``failures``; with ``hist``, the stored ones are counted in the history."""
    args: list[Any] = [GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(failures)]
    for f in failures:
        delay = "" if f.retry_delay_ms is None else f.retry_delay_ms
        args += [f.tid, f.eid, f.attempt, f.error, delay]
    args += [f.traceback for f in failures]
    head = [*qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base]
    keys = [*head, qk.lim_base, qk.flow_base, qk.flowq]
    if hist is None:  # the history block, after the tracebacks
        args.append(0)
    else:
        args.append(hist.ttl_s)
        args += hist.buckets
        keys.append(qk.hist_base)
    return Call("fail", keys, args)


@dataclass(frozen=True, slots=True)
class RunRef:
    """Identifies one run: the fencing triple."""

    tid: str
    eid: str
    attempt: int


def requeue_call(
    qk: QueueKeys,
    worker_id: str,
    runs: Sequence[RunRef],
    *,
    events_maxlen: int,
    ttl_s: int,
    max_interruptions: int,
    retry_delay_ms: int,
    started: bool = True,
    unknown_grace_ms: int | None = None,
) -> Call:
    """Hand ``runs`` back; ``started=False`` for runs whose body never began (no interruption
    is counted for them). ``unknown_grace_ms``: runs of a task name this worker does not know,
    handed back (due in ``retry_delay_ms``) only while a live worker declared the name within
    that grace; otherwise answered 'unknown' and left as they are."""
    kind = "unknown" if unknown_grace_ms is not None else "started" if started else "prefetched"
    head = [GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, max_interruptions]
    args: list[Any] = [*head, retry_delay_ms, len(runs), kind, unknown_grace_ms or 0]
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    keys = [*qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base]
    keys += [qk.lim_base, qk.flow_base, qk.flowq, qk.decl_seen]
    return Call("requeue", keys, args)


def recover_call(
    qk: QueueKeys,
    worker_id: str,
    known: Iterable[tuple[int, str]],
    *,
    events_maxlen: int,
    since_ms: int,
    per_band: int = 1000,
) -> Call:
    """Find this worker's runs whose claim reply was lost (lua/recover.lua); ``known``: the
    (priority, entry id) of every run the worker holds or left unanswered. Its reply is
    claim.lua's: :func:`parse_claim`."""
    args: list[Any] = [GROUP, worker_id, events_maxlen, since_ms, per_band, 0]
    for prio, eid in known:
        args += [prio, eid]
    args[5] = (len(args) - 6) // 2
    return Call("recover", [*qk.streams, qk.events, qk.stats, qk.task_base], args)
