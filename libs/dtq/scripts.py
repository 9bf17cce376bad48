"""Loading the Lua scripts and one typed wrapper per atomic transition.

Each script lives in ``lua/<name>.lua`` (shipped in the wheel as ``dtq/lua``) with a header that
lists its KEYS, ARGV and return value; ``lua/_common.lua`` is prepended to each. The wrappers
build the KEYS/ARGV lists (pure functions returning a :class:`Call`) and turn the raw reply into
a small frozen dataclass, so the sync client, the async client and the worker share them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.client import Redis as SyncRedis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dtq import transport
from dtq.connection import is_cluster
from dtq.keys import GROUP, QueueKeys

# (Re-exported: their home was this module.)
AsyncLane = transport.AsyncLane
MAX_ASYNC_LANES = transport.MAX_ASYNC_LANES

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "complete",
    "fail",
    "requeue",
    "reclaim",
    "touch",
    "promote",
    "cancel",
    "lock",
    "unlock",
)


def _lua_dir() -> Path:
    # The wheel ships the scripts as dtq/lua, beside this module (importlib.resources would say
    # the same, at 13 ms of import time for every process).
    packaged = Path(__file__).resolve().parent / "lua"
    if packaged.is_dir():
        return packaged
    # Editable install / source tree: lua/ sits at the repository root.
    return Path(__file__).resolve().parents[2] / "lua"


@cache
def source(name: str) -> str:
    """The full text of a script as sent to Redis: the shared helpers it uses, then the script.

    A script line ``-- include: _part`` prepends ``lua/_part.lua`` too (after the helpers):
    claim.lua and complete.lua share the claim transition that way. Of ``_common.lua`` only the
    definitions the script (or a definition it keeps) names are sent: Redis runs a script's
    whole text on every call, and each helper it defines is a closure made and collected per
    call (about 1 us per call for all of them, cache-cold, on a single enqueue).
    """
    d = _lua_dir()
    text = (d / f"{name}.lua").read_text()
    parts = []
    for line in text.splitlines():
        if line.startswith("-- include: "):
            parts.append((d / f"{line.removeprefix('-- include: ').strip()}.lua").read_text())
    body = "\n".join([*parts, text])
    return "\n".join([helpers_for(body, (d / "_common.lua").read_text()), body])


_DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*=)", re.MULTILINE)


_WORDS = re.compile(r"\w+")


def helpers_for(body: str, common: str) -> str:
    """The definitions of ``common`` that ``body`` needs, directly or through one another, in
    their order (a Lua local can only name locals defined before it). A definition starts at a
    ``local`` line in column 0 and takes the comment lines just above it."""
    blocks = _definitions(common)
    used = [False] * len(blocks)
    words = set(_WORDS.findall(body))  # every name the text needing helpers mentions
    for i in range(len(blocks) - 1, -1, -1):  # later definitions can only use earlier ones
        names, block = blocks[i]
        if not names.isdisjoint(words):
            used[i] = True
            words.update(_WORDS.findall(block))
    return "".join(b for (_, b), u in zip(blocks, used, strict=True) if u)


@cache
def _definitions(common: str) -> list[tuple[frozenset[str], str]]:
    """``common`` cut into its top-level definitions: (the names each defines, its text). Made
    once per process (every script's source asks; a worker builds them all at start)."""
    blocks: list[tuple[frozenset[str], str]] = []
    lead: list[str] = []  # comment lines waiting for their definition
    for line in common.splitlines(keepends=True):
        m = _DEFINES.match(line)
        if m:
            names = {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
            blocks.append((frozenset(names), "".join(lead) + line))
            lead = []
        elif line.startswith("--") or not line.strip() or not blocks:
            lead.append(line)  # a comment or blank line: the next definition's, or ...
        else:  # ... the definition goes on (any code line, in or after its body)
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + "".join(lead) + line)
            lead = []
    return blocks


class ScriptError(StrEnum):
    """Every error code a dtq script replies with (``redis.error_reply('<code> <detail>')``);
    redis-py raises it as a :class:`ResponseError` whose message starts with the code."""

    BAD_CALL = "DTQ_BAD_CALL"
    """The call was built wrong (enqueue.lua: a task's band has no stream among the KEYS):
    a bug in the caller; nothing was written."""
    DUPLICATE_ID = "DTQ_DUPLICATE_ID"
    """schedule_fire.lua: a record with the task id it was given exists; nothing was written."""

    @classmethod
    def of(cls, exc: ResponseError) -> ScriptError | None:
        """The code of a script's error reply, or None for any other error (Redis's own)."""
        code = str(exc).split(" ", 1)[0]
        return cls(code) if code in cls._value2member_map_ else None


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation, ready to send."""

    script: str
    keys: list[str]
    args: list[Any]


# The fast lane (a kept connection written to directly) is dtq.transport's; this layer asks it
# first and takes redis-py's usual path for whatever the lane cannot do.
#
# On a Redis Cluster there is no lane: a kept connection knows one node, not the slot map, so
# every call takes the cluster client's path (which follows MOVED/ASK and retries TRYAGAIN).
# ``is_cluster`` at construction is the one decision (``_cluster``). In a cluster
# pipeline redis-py refuses EVALSHA (it could not load a missing script there): a script call
# in a pipeline is sent as EVAL with its text, which Redis caches under the same SHA.
#
# The slot guard. A script reaches keys it was not given (a task's record, ``base .. tid``):
# same hash tag, so same slot, which is all a stable cluster needs. While that slot migrates,
# though, such a key may already be on the new node: Redis 7 then fails the script at that
# access ("non local key") with its earlier writes kept, a transition done half-way. On a
# cluster each call therefore declares one more key, of its slot, that never exists: a node
# serving a slot in migration answers TRYAGAIN (or ASK, then TRYAGAIN) to a call missing a key,
# so no script runs at all until the migration ends, and then it runs whole on the new owner.
# TRYAGAIN means "not run": the cluster client waits it out (connection.py). On a stable slot
# the guard costs nothing (Redis looks keys up only for slots in migration). Scripts that count
# their KEYS leave it out (``nkeys()`` in lua/_common.lua).
SLOT_GUARD = ":~slotguard"


def with_slot_guard(keys: list[str]) -> list[str]:
    """``keys`` and the slot guard of their slot (the first key's hash tag, as Redis reads it)."""
    first = keys[0]
    lo = first.find("{")
    hi = first.find("}", lo + 1) if lo >= 0 else -1
    tag = first[lo + 1 : hi] if lo >= 0 and hi > lo + 1 else first
    return [*keys, "{" + tag + "}" + SLOT_GUARD]


def _evalsha_args(sha: str, call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", sha, len(call.keys), *call.keys, *call.args)


class AsyncScripts:
    """Runs calls on an asyncio Redis client (EVALSHA, reloading after a NOSCRIPT).

    Any ``lua/<name>.lua`` can be called; each is registered on first use.
    """

    def __init__(
        self, redis: AsyncRedis, *, replay_safe: bool = False, fast_lane: bool | None = None
    ) -> None:
        """``replay_safe``: as for :class:`SyncScripts`. ``fast_lane``: Settings.fast_lane
        (None: DTQ_FAST_LANE); the lane is used only where dtq.transport finds what it needs."""
        self._redis = redis
        self._replay_safe = replay_safe
        self._cluster = is_cluster(redis)  # (see the fast lane above; a cluster has no lane)
        self._lanes = None if self._cluster or not transport.fast_lane(fast_lane) else (
            transport.AsyncLanes(redis)
        )  # fmt: skip
        self._objs = {n: redis.register_script(source(n)) for n in SCRIPT_NAMES}
        # Told of every call outside a pipeline whose reply may have been lost after Redis ran
        # it (a broken connection or a timeout once it was sent), re-sent or not: a worker
        # looks for the runs such a claim started (lua/recover.lua).
        self.on_reply_lost: Callable[[Call], None] | None = None

    @property
    def lanes(self) -> list[transport.AsyncLane]:
        """The lanes made so far (none without the fast lane)."""
        return [] if self._lanes is None else self._lanes.lanes

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            obj = self._objs[name] = self._redis.register_script(source(name))
        return obj

    def evalsha(self, call: Call) -> tuple[Any, ...]:
        """The EVALSHA command of ``call``, to send on a connection of one's own (a NOSCRIPT
        reply means it did not run; :meth:`run` loads the script)."""
        return _evalsha_args(self._obj(call.script).sha, call)

    async def run(self, call: Call, pipe: AsyncPipeline | None = None) -> Any:
        obj = self._obj(call.script)
        if self._cluster:  # (see the fast lane and the slot guard above)
            keys = with_slot_guard(call.keys)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)
            try:
                return await obj(keys=keys, args=call.args)
            except (ConnectionError, RedisTimeoutError, TimeoutError):
                self._reply_lost(call)  # as on the usual path below
                raise
        if pipe is not None:
            return await obj(keys=call.keys, args=call.args, client=pipe)
        lane = None if self._lanes is None else self._lanes.free()
        if lane is not None:
            lane.busy = True
            try:
                return await lane.call(_evalsha_args(obj.sha, call))
            except NoScriptError:
                pass  # nothing ran: the usual path loads the script
            except ConnectionError:
                # The lane was dropped (the usual path reconnects and sends again); the first
                # send may have run, its reply lost.
                self._reply_lost(call)
            except (RedisTimeoutError, TimeoutError):
                # The lane was dropped; the call may have run. Only a runner whose calls are
                # safe to re-send (the SDK's) sends it again.
                self._reply_lost(call)
                if not self._replay_safe:
                    raise
            finally:
                lane.busy = False
        try:
            return await obj(keys=call.keys, args=call.args)
        except (ConnectionError, RedisTimeoutError, TimeoutError):
            self._reply_lost(call)
            raise

    def _reply_lost(self, call: Call) -> None:
        if self.on_reply_lost is not None:
            self.on_reply_lost(call)

    async def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """:meth:`SyncScripts.run_many` for asyncio: streamed over one lane, reply k read (and
        handed to ``each``) after call k + 1 was sent; the same rules for errors."""
        calls = iter(calls)
        lane = None if self._lanes is None else self._lanes.free()
        if lane is None:
            return transport.each_reply([await self.run(c) for c in calls], each)
        st = transport.Stream(each)
        lane.busy = True
        try:
            await lane.stream(calls, self.evalsha, st)
        finally:
            lane.busy = False
        if st.fallback:  # nothing was sent: every call goes the usual way
            return transport.each_reply([await self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, await self.run(c))
        return st.replies


def hiredis_packing(client: AsyncRedis, *, fast_lane: bool | None = None) -> AsyncRedis:
    """Make ``client``'s new connections pack with hiredis (dtq.transport; a no-op on a
    cluster, whose nodes make their own, and without the fast lane)."""
    return client if is_cluster(client) else transport.hiredis_packing(client, setting=fast_lane)


class SyncScripts:
    """Runs calls on a blocking Redis client (thread-safe; see the fast lane above)."""

    def __init__(
        self, redis: SyncRedis, *, replay_safe: bool = False, fast_lane: bool | None = None
    ) -> None:
        """``replay_safe``: every call run here may be re-sent (the SDK's: see docs/faults.md),
        so a lane call that timed out goes the usual way too, whose retry policy re-sends it.
        ``fast_lane``: as for :class:`AsyncScripts`."""
        self._redis = redis
        self._cluster = is_cluster(redis)
        self.lane = None if self._cluster or not transport.fast_lane(fast_lane) else (
            transport.SyncLane(redis, replay_safe=replay_safe)
        )  # fmt: skip
        self._objs = {n: redis.register_script(source(n)) for n in SCRIPT_NAMES}

    def run(self, call: Call, pipe: Pipeline | None = None) -> Any:
        obj = self._obj(call.script)
        if self._cluster:  # (see the fast lane and the slot guard above)
            keys = with_slot_guard(call.keys)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)  # type: ignore[no-untyped-call]
            return obj(keys=keys, args=call.args)
        if pipe is None and self.lane is not None:
            res = self.lane.call(_evalsha_args(obj.sha, call))
            if res is not transport.MISS:
                return res
        return obj(keys=call.keys, args=call.args, client=pipe)

    def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Run ``calls`` in order; the replies in order (a script's error is raised).

        Over the lane each call is sent as soon as it is built, and the reply of call k is read
        (and handed to ``each(k, reply)``) only after call k + 1 was sent: Redis runs one call
        while the client builds the next and handles the one before (a bulk enqueue overlaps
        its encoding and its handles with the scripts). ``each`` sees every reply that is not
        an error, in order. Nothing is resent that may have run: a connection lost after the
        first send raises.
        """
        calls = iter(calls)
        st = transport.Stream(each)
        if self.lane is None or not self.lane.stream(calls, self._evalsha, st):
            return transport.each_reply([self.run(c) for c in calls], each)
        if st.fallback:  # nothing was sent: every call goes the usual way
            return transport.each_reply([self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, self.run(c))
        return st.replies

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            obj = self._objs[name] = self._redis.register_script(source(name))
        return obj

    def _evalsha(self, call: Call) -> tuple[Any, ...]:
        return _evalsha_args(self._obj(call.script).sha, call)


# --- enqueue ---------------------------------------------------------------------------------


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

    def maxr_arg(self) -> int | str:
        """enqueue.lua's max_retries field: the number, or "~<unset letters><number>"."""
        return f"~{self.unset}{self.max_retries}" if self.unset else self.max_retries


@dataclass(frozen=True, slots=True)
class Enqueued:
    tid: str
    status: str
    created: bool


def enqueue_call(qk: QueueKeys, tasks: Sequence[NewTask], events_maxlen: int) -> Call:
    if len(tasks) == 1:
        return enqueue_one_call(qk.prefix, qk.queue, tasks[0], events_maxlen)
    args: list[Any] = [events_maxlen, len(tasks)]
    for t in tasks:  # plain tasks send their 5 fixed fields only (see enqueue.lua)
        if _has_options(t):
            args = [events_maxlen, len(tasks)]
            for t in tasks:
                args += _task_args(t)
            break
        args += (t.tid, t.name, t.args, t.priority, t.maxr_arg() if t.unset else t.max_retries)
    head, streams = _enqueue_keys(qk.prefix, qk.queue)
    # Only the bands used: enqueue.lua finds each stream by its last character.
    return Call("enqueue", [*head, *(streams[p] for p in {t.priority for t in tasks})], args)


def enqueue_one_call(prefix: str, queue: str, t: NewTask, events_maxlen: int) -> Call:
    """:func:`enqueue_call` of one task, from the key prefix and queue name (the single
    enqueue's path: no QueueKeys is made, and the keys are looked up by two strings). A task
    without options sends only its 5 fixed fields (enqueue.lua reads the missing 8 as empty)."""
    head, streams = _enqueue_keys(prefix, queue)
    if _has_options(t):
        args = [events_maxlen, 1, *_task_args(t)]
    else:
        mr = t.maxr_arg() if t.unset else t.max_retries
        args = [events_maxlen, 1, t.tid, t.name, t.args, t.priority, mr]
    return Call("enqueue", [*head, streams[t.priority]], args)


def _has_options(t: NewTask) -> bool:
    """Whether any of the 8 options of enqueue.lua's task fields is set."""
    return bool(
        t.kwargs or t.timeout is not None or t.delay_ms or t.expires_ms or t.idempotency_key
        or t.meta or t.limit or t.headers
    )  # fmt: skip


def _task_args(t: NewTask) -> list[Any]:
    """enqueue.lua's 13 fields of one task: the 5 fixed ones, then the 8 options."""
    return [
        t.tid, t.name, t.args, t.priority, t.maxr_arg(), t.kwargs,
        "" if t.timeout is None else repr(float(t.timeout)), t.delay_ms, t.expires_ms,
        t.idempotency_key, t.meta, t.limit, t.headers,
    ]  # fmt: skip


# Key lists of the hot-path scripts, built once per queue (each is ~15-18 formatted strings;
# bounded for clients that use many queue names).
@lru_cache(maxsize=512)
def _enqueue_keys(prefix: str, queue: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """enqueue.lua's fixed keys, and the stream of each band indexed by priority."""
    qk = QueueKeys(prefix, queue)
    return (qk.sched, qk.events, qk.task_base, qk.idem_base), tuple(map(qk.stream, range(10)))


@lru_cache(maxsize=512)
def _claim_keys(qk: QueueKeys) -> tuple[str, ...]:
    return (
        *qk.streams, qk.paused, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.sched,
        qk.lim_base, qk.fair, qk.decl, qk.flow_base, qk.flowq,
    )  # fmt: skip


def parse_enqueue(raw: list[Any]) -> list[Enqueued]:
    return [
        Enqueued(_s(raw[i]), _s(raw[i + 1]), int(raw[i + 2]) == 1) for i in range(0, len(raw), 3)
    ]


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
) -> Call:
    return Call(
        "claim",
        list(_claim_keys(qk)),
        [GROUP, worker_id, count, events_maxlen, ttl_s, qk.done_base, 1 if fair else 0],
    )


def parse_claim(queue: str, raw: list[Any]) -> ClaimBatch:
    """claim.lua's reply (also the last element of complete.lua's when it claimed)."""
    now = int(raw[0])
    if int(raw[1]) == -1:
        return ClaimBatch(now, [], paused=True)
    if int(raw[1]) == -2:
        return ClaimBatch(now, [], missing_streams=True)
    absorbed, expired, n = int(raw[1]), int(raw[2]), int(raw[3])
    runs = []
    s = _s
    end = 4 + n * 13
    for b in range(4, end, 13):  # positional, no slice per run (claim is the hot path)
        runs.append(
            Claimed(
                queue, s(raw[b]), s(raw[b + 1]), int(raw[b + 2]), s(raw[b + 3]),
                s(raw[b + 4]), s(raw[b + 5]), int(raw[b + 6]),
                float(raw[b + 7]) if raw[b + 7] else None, int(raw[b + 8]), int(raw[b + 9]),
                int(raw[b + 10]), int(raw[b + 11]), s(raw[b + 12]),
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
class Success:
    tid: str
    eid: str
    attempt: int
    status: str  # "succeeded" | "cancelled"
    payload: str  # result JSON, or the cancel reason


def complete_call(
    qk: QueueKeys,
    worker_id: str,
    outcomes: Sequence[Success],
    events_maxlen: int,
    ttl_s: int,
    claim: int = 0,
    fair: bool = False,
) -> Call:
    """Store ``outcomes``; then, when ``claim`` > 0, claim up to that many runs (as claim.lua)."""
    args: list[Any] = [
        GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(outcomes), claim,
        1 if fair else 0,
    ]  # fmt: skip
    for o in outcomes:
        args += [o.tid, o.eid, o.attempt, o.status, o.payload]
    return Call("complete", list(_claim_keys(qk)), args)


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
    retry_delay_ms: int  # -1: no retry allowed
    traceback: str = ""  # "": none (a kept one is removed: it belonged to an older failure)


def fail_call(
    qk: QueueKeys, worker_id: str, failures: Sequence[Failure], events_maxlen: int, ttl_s: int
) -> Call:
    args: list[Any] = [GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(failures)]
    for f in failures:
        args += [f.tid, f.eid, f.attempt, f.error, f.retry_delay_ms]
    args += [f.traceback for f in failures]  # the optional trailing block
    return Call(
        "fail",
        [
            *qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base,
            qk.lim_base, qk.flow_base, qk.flowq,
        ],
        args,
    )  # fmt: skip


def parse_strings(raw: list[Any]) -> list[str]:
    return [_s(x) for x in raw]


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
) -> Call:
    """Hand ``runs`` back; ``started=False`` for runs whose body never began (no interruption
    is counted for them)."""
    args: list[Any] = [
        GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, max_interruptions,
        retry_delay_ms, len(runs), 1 if started else 0,
    ]  # fmt: skip
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    return Call(
        "requeue",
        [
            *qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base,
            qk.lim_base, qk.flow_base, qk.flowq,
        ],
        args,
    )  # fmt: skip


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


# --- reclaim, touch, promote -----------------------------------------------------------------


# XAUTOCLAIM calls one reclaim.lua call makes at most: with the reaper's COUNT (adopted per
# call), one call examines at most RECLAIM_STEPS x 10 x COUNT pending entries.
RECLAIM_STEPS = 10


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    requeued: int
    failed: int
    absorbed: int
    # Where the pass goes on: the band (KEYS index 1..10, p9 first; 0 once the pass is
    # complete) and the cursor in it, for the next call (reclaim_call's ``band``/``cursor``).
    band: int = 0
    cursor: str = "0-0"
    steps: int = 0  # XAUTOCLAIM calls this call made
    cancelled: int = 0  # lost runs whose cancel was requested: ended "cancelled"

    @property
    def more(self) -> bool:
        """The pass is not complete: call again from ``band``/``cursor``."""
        return self.band != 0


def reclaim_call(
    qk: QueueKeys,
    worker_id: str,
    *,
    min_idle_ms: int,
    count: int,
    events_maxlen: int,
    ttl_s: int,
    band: int = 1,
    cursor: str = "0-0",
    steps: int = RECLAIM_STEPS,
) -> Call:
    """One bounded step of a reclaim pass (see reclaim.lua): from ``band``/``cursor`` (a new
    pass by default), at most ``steps`` XAUTOCLAIMs of COUNT ``count``, at most ``count``
    entries adopted."""
    return Call(
        "reclaim",
        [
            *qk.streams, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.lim_base,
            qk.flow_base, qk.flowq,
        ],
        [
            GROUP, worker_id, min_idle_ms, count, events_maxlen, ttl_s, qk.done_base, band,
            cursor, steps,
        ],
    )  # fmt: skip


def parse_reclaim(raw: list[Any]) -> ReclaimResult:
    return ReclaimResult(
        int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]), _s(raw[4]), int(raw[5]), int(raw[6])
    )


@dataclass(frozen=True, slots=True)
class TouchResult:
    lost: list[str]
    cancel_requested: list[str]


def touch_call(qk: QueueKeys, worker_id: str, runs: Sequence[RunRef]) -> Call:
    args: list[Any] = [GROUP, worker_id, len(runs)]
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    return Call("touch", [*qk.streams, qk.task_base], args)


def parse_touch(raw: list[Any]) -> TouchResult:
    items = [_s(x) for x in raw]
    cut = items.index("|")
    return TouchResult(items[:cut], items[cut + 1 :])


@dataclass(frozen=True, slots=True)
class PromoteResult:
    promoted: int
    dropped: int
    next_due_ms: int | None


def promote_call(qk: QueueKeys, limit: int, events_maxlen: int) -> Call:
    return Call("promote", [*qk.streams, qk.sched, qk.events, qk.task_base], [limit, events_maxlen])


def parse_promote(raw: list[Any]) -> PromoteResult:
    nxt = int(raw[2])
    return PromoteResult(int(raw[0]), int(raw[1]), None if nxt < 0 else nxt)


# --- cancel, locks ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancelResult:
    outcome: str  # cancelled | requested | unchanged | missing
    status: str


# How long a state-changing SDK call's reply is kept for its re-send (lua/_replay.lua): longer
# than any client's re-send window (DTQ_CLIENT_RETRIES backoffs of at most 1 s, plus timeouts).
REPLY_TTL_MS = 60_000


def new_nonce() -> str:
    """A per-call nonce: the same call re-sent after a blip carries it and gets the first
    send's reply (lua/_replay.lua)."""
    return secrets.token_hex(8)


def cancel_call(
    qk: QueueKeys,
    tid: str,
    *,
    events_maxlen: int,
    ttl_s: int,
    hint_channel: str,
    reason: str,
    nonce: str | None = None,
) -> Call:
    """``nonce``: answer a re-send of this very call with its first reply (see new_nonce)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task(tid), qk.idem_base]
    args: list[Any] = [tid, events_maxlen, ttl_s, qk.done_channel(tid), hint_channel, reason]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq]
        args.append(REPLY_TTL_MS)
    return Call("cancel", keys, args)


def parse_cancel(raw: list[Any]) -> CancelResult:
    return CancelResult(_s(raw[0]), _s(raw[1]))


def limit_sweep_call(qk: QueueKeys, limit_keys: Sequence[str]) -> Call:
    """Release parked tasks of these limit keys (none: the keys owed a release); the reply is
    ``[released, more]``, more = 1 when the call's budget ran out."""
    return Call("limit_sweep", [*qk.streams, qk.task_base, qk.lim_base], list(limit_keys))


def consumer_prune_call(qk: QueueKeys, idle_ms: int) -> Call:
    """Delete the queue's stream consumers idle for idle_ms that hold no pending entry (the
    check and the delete in one step); the reply is the number deleted."""
    return Call("retention_consumers", qk.streams, [GROUP, idle_ms])


def queue_empty_call(qk: QueueKeys, drop: bool) -> Call:
    """1 when the queue holds nothing (lua/retention_queue.lua); with drop, its empty keys go."""
    keys = [*qk.streams, qk.sched, qk.dlq, qk.paused, qk.schedules, qk.lim_parked, qk.events]
    keys += [qk.stats, qk.fair, qk.decl, qk.flowq]
    return Call("retention_queue", keys, [GROUP, 1 if drop else 0])


def lock_call(key: str, token: str, lease_ms: int) -> Call:
    return Call("lock", [key], [token, lease_ms])


def unlock_call(key: str, token: str) -> Call:
    return Call("unlock", [key], [token])


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
