"""The whole Redis key layout, in one place.

Every key a Lua script touches belongs to one queue and carries that queue's hash tag
``{<prefix>:<queue>}`` (written ``P:{q}`` below), so each script runs in one slot on Redis Cluster.
Keys that no script touches (worker heartbeats, the scheduler lock, the schema version, the queue
registry) are global to the prefix.

Per queue (tag ``{P:q}``)::

    P:{q}:p0 .. P:{q}:p9   stream per priority band, consumer group "workers"
    P:{q}:t:<tid>          task record (hash); expires DTQ_RESULT_TTL_S after it ends
    P:{q}:sched            zset tid -> due time (ms): delayed tasks and retries
    P:{q}:dlq              zset tid -> failure time (ms): the dead-letter queue
    P:{q}:idem:<key>       idempotency key -> task id
    P:{q}:stats            hash of counters (absorbed duplicates, stale writes, ...)
    P:{q}:paused           exists while the queue is paused
    P:{q}:events           capped stream of lifecycle events
    P:{q}:done:<tid>       pub/sub channel announcing the task's terminal state
    P:{q}:lim:<k>:run      zset tid -> attempt: runs holding a place of limit key k
    P:{q}:lim:<k>:held     list of tids parked behind k's concurrency limit (status queued)
    P:{q}:lim:<k>:rate     zset start log of k over its rate window (expires when idle)
    P:{q}:lim:<k>:rwait    counter spreading k's rate-parked backlog over windows (expires)
    P:{q}:lim:~parked      set of limit keys that have parked tasks (purge finds them by it)
    P:{q}:lim:~owed        set of limit keys whose release ran out of budget (limit_sweep.lua)
    P:{q}:fair             hash band -> credit, fair mode's weighted round-robin state
    P:{q}:schedules        hash schedule name -> definition (JSON); periodic schedules
    P:{q}:schedules:next   zset schedule name -> next fire time (ms)
    P:{q}:schedules:last   hash schedule name -> tid of the last task it fired
    P:{q}:decl             hash task name -> "max_retries|timeout|expires_ms" a worker declared
    P:{q}:reply:<nonce>    a state-changing SDK call's reply, kept a minute for its re-send
    P:{q}:f:<ftid>         workflow state (hash) of a flow whose home is q (docs/workflows.md)
    P:{q}:flowq            stream: workflow handovers to another slot (moved by workers)

Global::

    P:schema               layout version, checked by workers at start
    P:queues               set of queue names seen (a partition ``q~i`` is listed as itself)
    P:partitions           hash logical queue -> partition count (absent: 1), dtq.partitions
    P:workers              zset worker id -> last heartbeat (ms)
    P:worker:<id>          worker heartbeat hash, expires after 3 heartbeat intervals; its
                           ``owner`` (host:pid) keeps a second process off a live id, its
                           ``tasks`` (JSON list) are the names the worker declares
    P:lock:scheduler:<q>   scheduler leader lock of queue q (value: worker id)
    P:lock:retention       retention pass lease (value: worker id)
    P:events:workers       capped stream of worker started/stopped events
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from dtq.errors import DtqError

SCHEMA_VERSION = "1"
GROUP = "workers"
PRIORITIES = tuple(range(9, -1, -1))  # served in this order: 9 first


class BadTaskId(DtqError, ValueError):
    """A string that is not a dtq task id."""


# Random parts of task ids, drawn from the OS 256 at a time: one getrandom call per id cost
# about half the time of making it (a bulk enqueue makes one per task). list.pop and extend are
# atomic, so threads never share a part; a forked child starts with an empty pool, or parent
# and child would hand out the same parts.
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
    # Hand-written on purpose: python-ulid gives this format as ULID().hex[:28] (48 bits of
    # milliseconds, then random) but takes 1.7 us per id against 0.44 us here, once per
    # enqueued task (tools/bench_handwritten.py); the stdlib's uuid7 is Python 3.14+.
    return f"{int(time.time() * 1000):012x}{_random_part()}"


PARTITION_SEP = "~"  # partition i > 0 of queue q is the internal queue "q~i" (dtq.partitions)


def make_task_id(queue: str, tid: str) -> str:
    """The public task id embeds the queue, so any client can find the task's keys. A task of
    partition i > 0 (queue ``q~i``) gets ``q:<tid>~i``: the id names the logical queue."""
    if PARTITION_SEP in queue:
        q, _, i = queue.partition(PARTITION_SEP)
        return f"{q}:{tid}{PARTITION_SEP}{i}"
    return f"{queue}:{tid}"


# A queue name, matched whole: with ``$`` "default\n" would pass (``$`` matches before a final
# newline) and name a queue no worker consumes. Use ``fullmatch`` (``\Z`` keeps ``match`` safe).
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
        raise BadTaskId(f"not a dtq task id: {task_id!r}")
    if m.group(3):
        return m.group(1) + m.group(3), m.group(2)
    return m.group(1), m.group(2)


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Keys of one queue; all share the queue's hash tag."""

    prefix: str
    queue: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:{self.queue}}}"

    def stream(self, priority: int) -> str:
        return f"{self.base}:p{priority}"

    @property
    def streams(self) -> list[str]:
        """Priority streams, highest band first."""
        return [self.stream(p) for p in PRIORITIES]

    @property
    def task_base(self) -> str:
        """Prefix of task record keys; scripts append the tid."""
        return f"{self.base}:t:"

    def task(self, tid: str) -> str:
        return f"{self.base}:t:{tid}"

    @property
    def sched(self) -> str:
        return f"{self.base}:sched"

    @property
    def dlq(self) -> str:
        return f"{self.base}:dlq"

    @property
    def idem_base(self) -> str:
        return f"{self.base}:idem:"

    def idem(self, key: str) -> str:
        return f"{self.base}:idem:{key}"

    @property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @property
    def paused(self) -> str:
        return f"{self.base}:paused"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def done_base(self) -> str:
        return f"{self.base}:done:"

    def done_channel(self, tid: str) -> str:
        return f"{self.base}:done:{tid}"

    @property
    def schedules(self) -> str:
        """Hash: schedule name -> its definition (JSON). See dtq.schedules."""
        return f"{self.base}:schedules"

    @property
    def schedules_next(self) -> str:
        """Zset: schedule name -> next fire time (ms)."""
        return f"{self.base}:schedules:next"

    def reply(self, nonce: str) -> str:
        """String: the kept reply of the state-changing call ``nonce`` (lua/_replay.lua)."""
        return f"{self.base}:reply:{nonce}"

    @property
    def schedules_last(self) -> str:
        """Hash: schedule name -> tid of its last fired task (for overlap=False)."""
        return f"{self.base}:schedules:last"

    @property
    def lim_base(self) -> str:
        """Prefix of the per-key limit keys (see dtq.limits); scripts append ``<key>:run`` etc."""
        return f"{self.base}:lim:"

    @property
    def lim_parked(self) -> str:
        """Set of limit keys that have parked tasks (lua/_common.lua)."""
        return f"{self.base}:lim:~parked"

    @property
    def lim_owed(self) -> str:
        """Set of limit keys whose release of a parked task ran out of budget."""
        return f"{self.base}:lim:~owed"

    @property
    def flow_base(self) -> str:
        """Prefix of the workflow state hashes homed on this queue; scripts append the ftid."""
        return f"{self.base}:f:"

    def flow(self, ftid: str) -> str:
        return f"{self.base}:f:{ftid}"

    @property
    def flowq(self) -> str:
        """Stream: this queue's workflow handovers to another slot (dtq_worker.flowmover)."""
        return f"{self.base}:flowq"

    @property
    def fair(self) -> str:
        return f"{self.base}:fair"

    @property
    def decl(self) -> str:
        """Hash: task name -> its declared defaults, published by workers (see dtq.declared).
        Not work: purge leaves it; retention drops it with a queue it forgets."""
        return f"{self.base}:decl"

    def all_fixed(self) -> list[str]:
        """Every key of the queue that is not per task: what purge and retention must know."""
        return [*self.streams, self.sched, self.dlq, self.stats, self.paused, self.events]


@dataclass(frozen=True, slots=True)
class Keys:
    """Key factory for one prefix."""

    prefix: str

    def queue(self, name: str) -> QueueKeys:
        return QueueKeys(self.prefix, name)

    @property
    def schema(self) -> str:
        return f"{self.prefix}:schema"

    @property
    def queues(self) -> str:
        return f"{self.prefix}:queues"

    @property
    def partitions(self) -> str:
        """Hash: logical queue -> its partition count, when above 1 (dtq.partitions)."""
        return f"{self.prefix}:partitions"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def scheduler_lock(self) -> str:
        return f"{self.prefix}:lock:scheduler"

    @property
    def worker_events(self) -> str:
        return f"{self.prefix}:events:workers"
