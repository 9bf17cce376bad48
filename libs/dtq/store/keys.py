"""The whole Redis key layout, in one place.

Every key a Lua script touches belongs to one queue and carries that queue's hash tag
``{<prefix>:<queue>}`` (written ``P:{q}`` below), so each script runs in one slot on Redis Cluster.
Keys that no script touches (worker heartbeats, the scheduler lock, the schema version, the queue
registry) are global to the prefix.

Every key is built here, by :class:`QueueKeys` (per queue) and :class:`Keys` (global); the Lua
scripts receive them as KEYS (and build the per-limit keys from ``lim_base``). :func:`layout`
describes each one: docs/design.md's key table is rendered from it (tools/key_table.py), and
tests/store/test_keys.py checks that every key a workload creates is in it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from dtq.errors import BadTaskId

SCHEMA_VERSION = "2"  # the task record layout this dtq writes and reads (docs/design.md)
GROUP = "workers"
# Added to a group's running count while its last run's end is to settle it (lua/includes/
# group_settle.lua): the running tasks are the count modulo this.
GROUP_MARK = 1 << 20
PRIORITIES = tuple(range(9, -1, -1))  # served in this order: 9 first


# Random parts of task ids, drawn from the OS 256 at a time; list.pop and extend are atomic, and
# a forked child empties the pool so it never repeats the parent's.
_RANDOM_PARTS: list[str] = []
os.register_at_fork(after_in_child=_RANDOM_PARTS.clear)


def _random_part() -> str:
    try:
        return _RANDOM_PARTS.pop()
    except IndexError:
        h = os.urandom(8 * 256).hex()
        _RANDOM_PARTS.extend([h[i : i + 16] for i in range(0, len(h), 16)])
        return _RANDOM_PARTS.pop()


def new_tid() -> str:
    """A time-ordered 28-hex-digit id: 12 digits of milliseconds, 16 random."""
    # Hand-written: docs/performance.md, "Hand-written code".
    return f"{int(time.time() * 1000):012x}{_random_part()}"


PARTITION_SEP = "~"  # partition i > 0 of queue q is the internal queue "q~i" (dtq.store.partitions)


@dataclass(frozen=True, slots=True)
class QueueRef:
    """One partition of a logical queue: what a physical queue name stands for (``bulk~2`` is
    partition 2 of ``bulk``; ``bulk`` itself is its partition 0). The one place that name is
    parsed and built."""

    queue: str
    partition: int = 0

    @classmethod
    def parse(cls, name: str) -> QueueRef:
        queue, sep, i = name.partition(PARTITION_SEP)
        return cls(queue, int(i) if sep else 0)

    @property
    def name(self) -> str:
        """The physical queue: its keys' hash tag is ``{P:<name>}``."""
        return f"{self.queue}{PARTITION_SEP}{self.partition}" if self.partition else self.queue

    def task_id(self, tid: str) -> str:
        """The public task id of task ``tid`` here: ``q:<tid>``, or ``q:<tid>~i`` for partition
        i > 0 (the id names the logical queue and carries the partition)."""
        if self.partition:
            return f"{self.queue}:{tid}{PARTITION_SEP}{self.partition}"
        return f"{self.queue}:{tid}"


def make_task_id(queue: str, tid: str) -> str:
    """The public id of task ``tid`` of physical queue ``queue`` (:meth:`QueueRef.task_id`)."""
    return QueueRef.parse(queue).task_id(tid)


# A queue name, matched whole: ``\Z``, not ``$``, which would let "default\n" pass.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}\Z")
_TASK_ID_RE = re.compile(r"([A-Za-z0-9_.\-]{1,100}):([A-Za-z0-9_.\-]{1,128}?)(~[1-9][0-9]{0,2})?")


FLOW_TID_PREFIX = "wf"  # a workflow's tid: "wf" + a task tid (hex digits never start with "w")


def new_flow_tid() -> str:
    return FLOW_TID_PREFIX + new_tid()


def is_flow_id(task_id: str) -> bool:
    """True for a workflow id (``<home queue>:wf<tid>``); no Redis call."""
    return split_task_id(task_id)[1].startswith(FLOW_TID_PREFIX)


def split_task_id(task_id: str) -> tuple[str, str]:
    """(queue, tid) of a public task id; :class:`BadTaskId` for anything else (None included).
    The queue is the physical one: ``q~i`` for a task of partition i > 0 (``q:<tid>~i``)."""
    m = _TASK_ID_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if m is None:
        raise BadTaskId(f"not a dtq task id: {task_id!r} (expected <queue>:<tid>)")
    if m.group(3):
        return m.group(1) + m.group(3), m.group(2)
    return m.group(1), m.group(2)


_TASK_PART = "t:"  # a task record: P:{P:q}:t:<tid>
_FLOW_PART = "f:"  # a workflow's state: P:{P:q}:f:<ftid>
_FLOW_PUT_PART = "fput:"  # a workflow step's put delivered: P:{P:q}:fput:<tid>


def glob_escape(s: str) -> str:
    """``s`` matched literally in a SCAN ``MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


class _Key:
    """A key at a fixed place under its owner's :attr:`base`: ``<base>:<suffix>``. What each
    holds is said once, in :func:`layout`."""

    __slots__ = ("suffix",)

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, obj: QueueKeys | Keys, owner: type | None = None) -> str:
        return f"{obj.base}:{self.suffix}"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Keys of one queue; all share the queue's hash tag. A ``*_base`` is the prefix of a family
    of keys that scripts complete (a tid, a limit key, an hour)."""

    prefix: str
    queue: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:{self.queue}}}"

    task_base = _Key(_TASK_PART)
    group_base = _Key("g:")  # the fair-group keys below (docs/groups.md)
    group_index = _Key("g:idx")
    group_paused = _Key("g:paused")
    sched = _Key("sched")
    dlq = _Key("dlq")
    idem_base = _Key("idem:")
    stats = _Key("stats")
    hist_base = _Key("h:")
    hist_enq_base = _Key("he:")
    paused = _Key("paused")
    events = _Key("events")
    done_base = _Key("done:")
    schedules = _Key("schedules")
    schedules_next = _Key("schedules:next")
    schedules_last = _Key("schedules:last")
    schedules_seen = _Key("schedules:seen")
    lim_base = _Key("lim:")  # see dtq.limits; scripts append ``<key>:run`` etc.
    lim_parked = _Key("lim:~parked")
    lim_owed = _Key("lim:~owed")
    flow_base = _Key(_FLOW_PART)
    flowq = _Key("flowq")
    fair = _Key("fair")
    decl = _Key("decl")
    decl_seen = _Key("decl:seen")

    def stream(self, priority: int) -> str:
        return f"{self.base}:p{priority}"

    @property
    def streams(self) -> list[str]:
        """Priority streams, highest band first."""
        return [self.stream(p) for p in PRIORITIES]

    def task(self, tid: str) -> str:
        return self.task_base + tid

    @property
    def task_pattern(self) -> str:
        """SCAN ``MATCH`` pattern of this queue's task records."""
        return glob_escape(self.task_base) + "*"

    def group_waiting(self, band: int, group: str) -> str:
        return f"{self.group_base}w:{band}:{group}"

    def group_running(self, group: str) -> str:
        """How many of the group's tasks run (0 while the group is active with none), plus
        ``GROUP_MARK`` while the end of its last run is to settle the group (a turn of it
        ended while it ran): the count is the value modulo ``GROUP_MARK``."""
        return f"{self.group_base}run:{group}"

    def idem(self, key: str) -> str:
        return self.idem_base + key

    def done_channel(self, tid: str) -> str:
        return self.done_base + tid

    def reply(self, nonce: str) -> str:
        return f"{self.base}:reply:{nonce}"

    def flow(self, ftid: str) -> str:
        return self.flow_base + ftid

    def flow_put(self, tid: str) -> str:
        return f"{self.base}:{_FLOW_PUT_PART}{tid}"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key factory for one prefix."""

    prefix: str

    @property
    def base(self) -> str:
        return self.prefix

    schema = _Key("schema")
    queues = _Key("queues")
    partitions = _Key("partitions")
    workers = _Key("workers")
    worker_events = _Key("events:workers")
    scheduler_lock = _Key("lock:scheduler")
    retention_lock = _Key("lock:retention")
    cancel_channel = _Key("cancel")

    def queue(self, name: str) -> QueueKeys:
        return QueueKeys(self.prefix, name)

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def scheduler_lock_of(self, queue: str) -> str:
        return f"{self.scheduler_lock}:{queue}"

    def wake_channel(self, token: str) -> str:
        return f"{self.prefix}:wake:{token}"

    @property
    def queue_head(self) -> str:
        """What every per-queue key starts with, up to the queue name: ``P:{P:``."""
        return f"{self.prefix}:{{{self.prefix}:"

    def queue_key_parts(self, key: str) -> tuple[str, str] | None:
        """(queue, the rest after ``}:``) of a per-queue key of this prefix, else None."""
        head = self.queue_head
        close = key.find("}:", len(head))
        if not key.startswith(head) or close < 0:
            return None
        return key[len(head) : close], key[close + 2 :]

    def task_key_parts(self, key: str) -> tuple[str, str] | None:
        """(queue, tid) of a task record key of this prefix, else None."""
        return self._parts(key, _TASK_PART)

    def flow_key_parts(self, key: str) -> tuple[str, str] | None:
        """(home queue, ftid) of a workflow state key of this prefix, else None."""
        return self._parts(key, _FLOW_PART)

    def _parts(self, key: str, part: str) -> tuple[str, str] | None:
        parts = self.queue_key_parts(key)
        if parts is None or not parts[1].startswith(part):
            return None
        return parts[0], parts[1][len(part) :]

    @property
    def every_queue_key_pattern(self) -> str:
        """SCAN ``MATCH`` pattern of every per-queue key of this prefix."""
        return glob_escape(self.queue_head) + "*"

    @property
    def every_task_key_pattern(self) -> str:
        """SCAN ``MATCH`` pattern of the task records of every queue of this prefix."""
        return glob_escape(self.queue_head) + "*}:" + glob_escape(_TASK_PART) + "*"

    def partitioned_task_key_pattern(self, queue: str) -> str:
        """SCAN ``MATCH`` pattern of the task records of ``queue`` and its partitions
        (``q~i``, dtq.store.partitions): the tag is ``{P:q}`` or ``{P:q~...}``."""
        head = glob_escape(self.queue_head + queue)
        return head + "[}" + PARTITION_SEP + "]*:" + glob_escape(_TASK_PART) + "*"


@dataclass(frozen=True, slots=True)
class KeyDoc:
    """One kind of key: the key as :class:`Keys` builds it (placeholders in ``<>``), its Redis
    type, what it holds."""

    key: str
    type: str
    what: str


def layout(prefix: str = "P", queue: str = "q") -> list[KeyDoc]:
    """Every kind of key dtq creates, built by the methods above for ``prefix`` and ``queue``."""
    k = Keys(prefix)
    qk = k.queue(queue)
    lim = qk.lim_base + "<k>"  # the per-limit keys are built by the scripts from lim_base
    return [
        KeyDoc(qk.stream(0).removesuffix("0") + "<band>", "stream + group `workers`",
               "one stream per priority band (9 served first); entry = `t <tid>`"),
        KeyDoc(qk.task("<tid>"), "hash",
               "the task record (below); expires `DTQ_RESULT_TTL_S` after it ends"),
        KeyDoc(qk.sched, "zset", "tid → due time (ms): delayed tasks and retries"),
        KeyDoc(qk.dlq, "zset", "tid → failure time (ms): the dead-letter queue"),
        KeyDoc(qk.idem("<key>"), "string", "idempotency key → tid"),
        KeyDoc(qk.stats, "hash", "counters: `absorbed` duplicates, `stale_writes` rejected, ..."),
        KeyDoc(qk.hist_base + "<hour>", "string",
               "history: per minute of the hour, 16 u32 counters (`dtq.stats`)"),
        KeyDoc(qk.hist_enq_base + "<minute>", "string",
               "history: tasks enqueued in that minute, an integer (`dtq.stats`)"),
        KeyDoc(qk.paused, "string", "exists while the queue is paused"),
        KeyDoc(qk.events, "stream", "capped lifecycle events (`DTQ_EVENTS_MAXLEN`)"),
        KeyDoc(qk.done_channel("<tid>"), "pub/sub channel",
               "announces the task's terminal state (no key is stored; sharded on a "
               "cluster: SPUBLISH)"),
        KeyDoc(lim + ":run", "zset", "tid → attempt: runs holding a place of limit key k"),
        KeyDoc(lim + ":held", "list", "tids parked behind k's concurrency limit (status queued)"),
        KeyDoc(lim + ":rate", "zset", "start log of k over its rate window (expires when idle)"),
        KeyDoc(lim + ":rwait", "string",
               "counter spreading k's rate-parked backlog over windows (expires)"),
        KeyDoc(qk.lim_parked, "set", "limit keys that have parked tasks (purge finds them by it)"),
        KeyDoc(qk.lim_owed, "set",
               "limit keys whose release ran out of budget (`lua/limit_sweep.lua`)"),
        KeyDoc(qk.fair, "hash", "band → credit: fair mode's weighted round-robin state"),
        KeyDoc(qk.schedules, "hash", "schedule name → definition (JSON): periodic schedules"),
        KeyDoc(qk.schedules_next, "zset",
               "schedule name → next fire time (ms); +inf while disabled"),
        KeyDoc(qk.schedules_last, "hash", "schedule name → tid of the last task it fired"),
        KeyDoc(qk.decl, "hash",
               "task name → `max_retries\\|timeout_s\\|expires_ms` declared by workers "
               "(see [Declared defaults](#declared-defaults))"),
        KeyDoc(qk.decl_seen, "hash",
               "task name → when a live worker consuming the queue last declared it (ms); a "
               "worker that does not know a name hands its tasks back while this is within "
               "`DTQ_DECLARATION_GRACE_S`; clients read it for `UndeclaredTaskWarning`"),
        KeyDoc(qk.schedules_seen, "hash",
               "code schedule name → when a live worker last declared it (ms); the leader "
               "removes a code schedule nobody declared for `DTQ_DECLARATION_GRACE_S`"),
        KeyDoc(qk.reply("<nonce>"), "string",
               "a state-changing SDK call's reply, kept a minute for its re-send"),
        KeyDoc(qk.flow("<ftid>"), "hash",
               "a workflow homed on this queue: status, counters, each step's id, waiting "
               "steps' specs, results ([workflows.md](workflows.md))"),
        KeyDoc(qk.flowq, "stream + group `movers`",
               "workflow handovers to another slot (`note`: a step ended; `put`: a step "
               "released), moved by workers"),
        KeyDoc(qk.flow_put("<tid>"), "string",
               "a workflow step's `put` was delivered here (or its flow cancelled first): "
               "moving it again creates nothing; no TTL until the put's outbox entry is "
               "acknowledged, then `DTQ_RESULT_TTL_S`"),
        KeyDoc(k.schema, "string",
               "the task record's layout version, `2`, set by the first worker; a worker "
               "refuses a keyspace of another (exit 2)"),
        KeyDoc(k.queues, "set", "queue names seen (a partition `q~i` as itself)"),
        KeyDoc(k.partitions, "hash",
               "queue → partition count of a partitioned queue (`DTQ_QUEUE_PARTITIONS`)"),
        KeyDoc(k.workers, "zset", "worker id → last heartbeat (ms)"),
        KeyDoc(k.worker("<id>"), "hash",
               "worker heartbeat, expires after 3 heartbeat intervals; its `owner` (host:pid) "
               "keeps a second process off a live id, its `tasks` (JSON) are the names it "
               "declares"),
        KeyDoc(k.scheduler_lock_of("<queue>"), "string",
               "scheduler leader lock per queue (value: worker id)"),
        KeyDoc(k.retention_lock, "string", "retention pass lease (value: worker id)"),
        KeyDoc(k.worker_events, "stream", "capped worker `started`/`stopped` events"),
        KeyDoc(k.cancel_channel, "pub/sub channel",
               "cancel hints for running tasks (no key is stored)"),
        KeyDoc(k.wake_channel("<token>"), "pub/sub channel",
               "wakes one blocking Client's result() reader to subscribe a new wait (no key "
               "is stored)"),
    ]  # fmt: skip
