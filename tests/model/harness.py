"""The model test's plumbing: dtq's own scripts on a real redis-server under a clock the test
sets, calls that may lose their reply or get an error reply instead of running, and a reader of
the Redis state the invariants are checked against (docs/design.md, "Invariants the model
checks").

The call builders and reply parsers are dtq's (``dtq.scripts``); only the transport is this
module's: each script is registered with the text :func:`dtq.scripts.source` makes, its one
read of the server's time (``redis.call('TIME')`` in lua/includes/now_ms.lua) adding the
offset in the key :data:`CLOCK`, so expiry, delays and rate windows follow the model's clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys

CLOCK = "dtqmodel:offset"
"""Milliseconds the model's clock is ahead of the server's: what the scripts' TIME answers is
the server's time plus it. (An enqueue's time is its stream entry's id, the server's own clock:
a task enqueued before the clock moved on counts as enqueued that much earlier.)"""
_TIME = (
    "(function() local t = redis.call('TIME'); "
    f"local o = tonumber(redis.call('GET', '{CLOCK}') or '0'); "
    "local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + o * 1000; "
    "return {string.format('%d', math.floor(us / 1000000)), string.format('%d', us % 1000000)} "
    "end)()"
)


class Fault(enum.Enum):
    """What happens to one call: it runs and its reply comes; it runs and its reply is lost
    (the caller sees a connection error); or Redis answers an error instead of running it."""

    NONE = "none"
    LOST = "lost"
    LOADING = "LOADING Redis is loading the dataset in memory"
    READONLY = "READONLY You can't write against a read only replica."
    OOM = "OOM command not allowed when used memory > 'maxmemory'."
    NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."


ERROR_REPLIES = (Fault.LOADING, Fault.READONLY, Fault.OOM, Fault.NOSCRIPT)


class ReplyLost(Exception):
    """The call ran; its reply did not reach the caller (a broken connection)."""


class ErrorReply(Exception):
    """Redis answered an error instead of running the call."""


class ClockedScripts:
    """Runs dtq's script calls on ``r`` with the model's clock, with an optional fault."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._objs: dict[str, Any] = {}
        self.offset_ms = 0
        self.r.set(CLOCK, 0)

    def advance(self, ms: int) -> None:
        self.offset_ms += ms
        self.r.set(CLOCK, self.offset_ms)

    def now_ms(self) -> int:
        sec, us = self.r.time()
        return int(sec) * 1000 + int(us) // 1000 + self.offset_ms

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            text = sc.source(name)
            assert "redis.call('TIME')" in text or "now_ms" not in text, name
            text = text.replace("redis.call('TIME')", _TIME)
            obj = self._objs[name] = self.r.register_script(text)
        return obj

    def run(self, call: sc.Call, fault: Fault = Fault.NONE) -> Any:
        if fault in ERROR_REPLIES:
            raise ErrorReply(fault.value)
        reply = self._obj(call.script)(keys=call.keys, args=call.args)
        if fault is Fault.LOST:
            raise ReplyLost(call.script)
        return reply


@dataclass
class Snapshot:
    """The Redis state of one queue the invariants read."""

    records: dict[str, dict[str, str]]
    entries: dict[str, list[tuple[int, str]]]  # tid -> (band, entry id) of its stream entries
    pending: dict[tuple[int, str], str]  # (band, entry id) -> consumer it is pending to
    sched: dict[str, float]
    dlq: set[str]
    run_sets: dict[str, dict[str, int]]  # limit key -> tid -> attempt
    held: dict[str, list[str]]  # limit key -> parked tids
    owed: set[str]
    paused: bool
    stream_tids: dict[tuple[int, str], str] = field(default_factory=dict)  # entry -> tid
    # The entries group_issue gave (field g: a fair group's turn, docs/groups.md)
    turn_entries: set[tuple[int, str]] = field(default_factory=set)


def snapshot(r: redis.Redis, qk: QueueKeys, tids: list[str], limit_keys: list[str]) -> Snapshot:
    """Read it in one pipelined round trip."""
    with r.pipeline(transaction=True) as p:
        for tid in tids:
            p.hgetall(qk.task(tid))
        for band in range(10):
            p.xrange(qk.stream(band))
            p.xpending_range(qk.stream(band), GROUP, "-", "+", 10_000)
        p.zrange(qk.sched, 0, -1, withscores=True)
        p.zrange(qk.dlq, 0, -1)
        for lk in limit_keys:
            p.zrange(f"{qk.lim_base}{lk}:run", 0, -1, withscores=True)
            p.lrange(f"{qk.lim_base}{lk}:held", 0, -1)
        p.smembers(f"{qk.lim_base}~owed")
        p.exists(qk.paused)
        out = iter(p.execute())
    records = {}
    for tid in tids:
        rec = next(out)
        if rec:
            records[tid] = rec
    entries: dict[str, list[tuple[int, str]]] = {}
    stream_tids: dict[tuple[int, str], str] = {}
    pending: dict[tuple[int, str], str] = {}
    turn_entries: set[tuple[int, str]] = set()
    for band in range(10):
        for eid, f in next(out):
            entries.setdefault(f["t"], []).append((band, eid))
            stream_tids[(band, eid)] = f["t"]
            if "g" in f:
                turn_entries.add((band, eid))
        for pe in next(out):
            pending[(band, pe["message_id"])] = pe["consumer"]  # (ids are per stream)
    sched = {k: s for k, s in next(out)}
    dlq = set(next(out))
    run_sets, held = {}, {}
    for lk in limit_keys:
        run_sets[lk] = {k: int(s) for k, s in next(out)}
        held[lk] = next(out)
    owed = set(next(out))
    return Snapshot(
        records,
        entries,
        pending,
        sched,
        dlq,
        run_sets,
        held,
        owed,
        bool(next(out)),
        stream_tids,
        turn_entries,
    )
