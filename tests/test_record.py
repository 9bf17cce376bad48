"""The task record's field names are defined once (dtq/record.py) and the scripts use no other;
every script error code is named once (dtq.scripts.ScriptError)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from dtq import scripts as sc
from dtq.keys import QueueKeys
from dtq.record import MEANING, Field

Q = "q1"
ROOT = Path(__file__).resolve().parents[1]
LUA = sorted((ROOT / "lua").glob("*.lua"))
# A redis.call on a task record: the record key is one of these expressions in the scripts.
RECORD_CALL = re.compile(
    r"redis\.call\('(HMGET|HGET|HSET|HDEL|HINCRBY|HSETNX|HEXISTS)',\s*"
    r"(rk|prk|k|base \.\. [\w\[\]]+|KEYS\[3\] \.\. prev|KEYS\[12\] \.\. last)\s*,"
)


def _args(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments from ``start`` to the call's closing paren."""
    depth, cur, out = 0, "", []
    for ch in text[start:]:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


# A table of record fields by name, for a record read whole (HGETALL): ``local FIELD = {status =
# 1, ...}`` in lua/_claim.lua. Its keys are field names too.
FIELD_TABLE = re.compile(r"local (?:\w+_)?FIELD = \{([^}]*)\}")


def record_fields_in(text: str) -> set[str]:
    """Field names the script text reads from or writes to a task record (quoted literals at
    field positions: every argument of HMGET/HGET/HDEL, every other one of HSET; and the keys of
    a field table)."""
    found = set()
    for m in FIELD_TABLE.finditer(text):
        found |= set(re.findall(r"(\w+) = \d+", m.group(1)))
    for m in RECORD_CALL.finditer(text):
        args = _args(text, m.end())
        names = args[::2] if m.group(1) in ("HSET", "HINCRBY", "HSETNX") else args
        for a in names:
            lit = re.fullmatch(r"'([a-z]+)'", a)
            if lit:
                found.add(lit.group(1))
    return found


def test_every_field_a_script_uses_is_defined_once_with_a_meaning() -> None:
    used = set().union(*(record_fields_in(p.read_text()) for p in LUA))
    assert used - {f.value for f in Field} == set()
    assert set(MEANING) == set(Field)
    assert len({f.value for f in Field}) == len(Field)  # no name twice


def test_the_scan_sees_reads_and_writes() -> None:
    text = (ROOT / "lua" / "complete.lua").read_text() + (ROOT / "lua" / "_claim.lua").read_text()
    got = record_fields_in(text)
    assert {"status", "attempt", "worker", "cancel", "flow", "hdr", "result", "started"} <= got
    assert "running" not in got and "expired before it started" not in got  # values, not fields


def test_design_md_lists_every_field() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## The task record") : text.index("## Transitions")]
    listed = set(re.findall(r"`([a-z]+)`", table))
    assert {f.value for f in Field} - listed == set()


def test_every_script_error_code_is_named(r: redis.Redis, qk: QueueKeys) -> None:
    codes = set()
    for p in LUA:
        codes |= set(re.findall(r"error_reply\('(DTQ_[A-Z_]+)", p.read_text()))
    assert codes == {e.value for e in sc.ScriptError}
    call = sc.enqueue_call(qk, [_task(3)], 100)
    call = sc.Call(call.script, [k for k in call.keys if not k.endswith(":p3")], call.args)
    with pytest.raises(redis.ResponseError) as info:
        sc.SyncScripts(r).run(call)
    assert sc.ScriptError.of(info.value) is sc.ScriptError.BAD_CALL
    assert sc.ScriptError.of(redis.ResponseError("NOGROUP no such group")) is None


def _task(prio: int) -> sc.NewTask:
    from dtq.keys import new_tid

    return sc.NewTask(new_tid(), "t", "[]", "", prio, 3, None, 0, 0, "", "")


BASE_QUEUED = {
    Field.NAME, Field.ARGS, Field.PRIORITY, Field.MAX_RETRIES, Field.ATTEMPT, Field.RETRIES,
    Field.INTERRUPTIONS, Field.ENQUEUED, Field.STATUS, Field.ENTRY_ID,
}  # fmt: skip


def test_a_plain_record_holds_exactly_the_base_fields(r: redis.Redis, qk: QueueKeys) -> None:
    """A plain task's record holds exactly the base fields (10 queued, 12 running) and any
    option makes it longer: the record's size per task (workload F) depends on it."""
    from tests.conftest import create_groups

    create_groups(r, qk)
    run = sc.SyncScripts(r).run
    plain, opt = _task(5), _task(5)
    opt.kwargs = '{"a":1}'
    run(sc.enqueue_call(qk, [plain, opt], 100))
    assert set(r.hkeys(qk.task(plain.tid))) == {f.value for f in BASE_QUEUED}
    assert r.hlen(qk.task(opt.tid)) == 11
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 10, 100, 60)))
    runs = {c.tid: c for c in batch.runs}
    assert runs[opt.tid].kwargs == '{"a":1}' and runs[plain.tid].kwargs == ""
    running = BASE_QUEUED | {Field.WORKER, Field.STARTED}
    assert set(r.hkeys(qk.task(plain.tid))) == {f.value for f in running}
    # A cancel requested meanwhile makes a 13th field: the outcome write reads it.
    sc.SyncScripts(r).run(
        sc.cancel_call(qk, plain.tid, events_maxlen=0, ttl_s=60, hint_channel="h", reason="stop")
    )
    c = runs[plain.tid]
    done = sc.Success(c.tid, c.eid, c.attempt, "cancelled", "generic")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [done], 100, 60))) == [True]
    assert r.hget(qk.task(plain.tid), Field.ERROR) == "stop"
