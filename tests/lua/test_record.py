"""The task record's field names are defined once (store/record.py) and the scripts use no other;
every script error code is named once (dtq.scripts.ScriptError), and every sentinel a script
answers by an enum of its wrapper (dtq.scripts.REPLIES)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskFailed
from dtq import scripts as sc
from dtq.store.keys import QueueKeys
from dtq.store.record import MEANING, Field
from tests.apps.basic import app as basic_app

Q = "q1"
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "lua").glob("*.lua"))
LUA = SCRIPTS + sorted((ROOT / "lua" / "includes").glob("*.lua"))  # and their helpers
# A redis.call on a task record: the record key is one of these expressions in the scripts.
RECORD_KEYS = r"rk|prk|k|base \.\. [\w\[\]]+|KEYS\[3\] \.\. prev|KEYS\[12\] \.\. last"


def _record_call(keys: str) -> re.Pattern[str]:
    return re.compile(
        rf"redis\.call\('(HMGET|HGET|HSET|HDEL|HINCRBY|HSETNX|HEXISTS)',\s*({keys})\s*,"
    )


RECORD_CALL = _record_call(RECORD_KEYS)
# A script given one task record as a key says so in its header: "KEYS[n]  P:{q}:t:<tid>".
RECORD_KEY_ARG = re.compile(r"^-- (KEYS\[\d+\])\s+P:\{\w+\}:t:<tid>", re.M)


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
# 1, ...}`` in lua/includes/claim_entries.lua. Its keys are field names too.
FIELD_TABLE = re.compile(r"local (?:\w+_)?FIELD = \{([^}]*)\}")


def record_fields_in(text: str) -> set[str]:
    """Field names the script text reads from or writes to a task record (quoted literals at
    field positions: every argument of HMGET/HGET/HDEL, every other one of HSET; and the keys of
    a field table)."""
    found = set()
    for m in FIELD_TABLE.finditer(text):
        found |= set(re.findall(r"(\w+) = \d+", m.group(1)))
    given = [re.escape(k) for k in RECORD_KEY_ARG.findall(text)]  # (progress.lua's KEYS[1])
    calls = _record_call("|".join([RECORD_KEYS, *given])) if given else RECORD_CALL
    for m in calls.finditer(text):
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
    text = (ROOT / "lua" / "complete.lua").read_text()
    text += (ROOT / "lua" / "includes" / "claim_entries.lua").read_text()
    got = record_fields_in(text)
    assert {"status", "attempt", "worker", "cancel", "flow", "hdr", "result", "started"} <= got
    assert "running" not in got and "expired before it started" not in got  # values, not fields
    # A record given as a key of its own (KEYS[1] in progress.lua and flow_tomb.lua).
    assert {"progress", "status", "worker"} <= record_fields_in(
        (ROOT / "lua" / "progress.lua").read_text()
    )
    assert {"maxr", "finished"} <= record_fields_in((ROOT / "lua" / "flow_tomb.lua").read_text())


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


# What a script answers that is not a count or an id, as the scripts spell it:
# - a literal in the header's "Returns" block (its doc: 'stale', '|', {now_ms, -1}, ...);
# - a literal returned, alone or first in a table: ``return 'x'``, ``return {'x', ...}``;
# - a literal pushed on the reply table (a table the script returns): ``out[#out + 1] = 'x'``;
# - a bare number returned (a flag: ``return 0``), or a negative number ending a returned table
#   (``return {now, -1}``).
# The script's own text is read, with the transition it includes (claim_entries), not the other
# helpers; a local function's body counts only when a top-level
# ``return`` line names the function (its value is the reply: cancel.lua's cancel()), and a
# nested one's never, so a helper's own values (purge.lua's stream bound '-', the claim's list
# of record fields to write) are not taken for replies.
RETURNS_BLOCK = re.compile(r"^-- Returns(.*?)(?=^-- [A-Z]|^--\s*$|^[^-])", re.M | re.S)
RETURNED = re.compile(r"\breturn\s+\{?\s*'([^']*)'\s*(?:[,}]|end\b|$)", re.M)
PUSHED = re.compile(r"(\w+)\[#\1 \+ 1\] = '([^']*)'")
REPLY_TABLE = re.compile(r"\breturn\s+(\w+)\s*(?:end\b|$)|keep_reply\([^,]+,[^,]+,\s*(\w+)\)", re.M)
FLAG = re.compile(r"\breturn\s+(-?\d+)\s*(?:end\b|$)", re.M)
NEGATIVE = re.compile(r"\breturn\s+\{[^}]*?,\s*(-\d+)\s*\}")
HEADER_NEGATIVE = re.compile(r"(?<![\w\]])(-\d+)\b")
LOCAL_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end\b", re.M | re.S)
NESTED_FUNCTION = re.compile(r"^( +)local function \w+\(.*?^\1end\b", re.M | re.S)


def _script_text(path: Path) -> str:
    text = path.read_text()
    parts = re.findall(r"^-- include: (\w+)", text, re.M)
    inc = ROOT / "lua" / "includes"
    return "\n".join(
        [*((inc / f"{p}.lua").read_text() for p in parts if p == "claim_entries"), text]
    )


def sentinels_in(text: str, header: str) -> set[str | int]:
    """The sentinel replies a script's text can answer (see above)."""
    found: set[str | int] = set()
    for m in RETURNS_BLOCK.finditer(header):
        block = m.group(1)
        found |= set(re.findall(r"(?<!\w)'([^'\n]*)'(?!\w)", block))  # (not "task's")
        found |= {int(x) for x in HEADER_NEGATIVE.findall(block)}
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    top = "\n".join(line for line in code.splitlines() if line.startswith("return"))
    code = NESTED_FUNCTION.sub("", code)  # a function's helper: its values are not replies
    code = LOCAL_FUNCTION.sub(lambda m: m.group(0) if m.group(1) in top else "", code)
    tables = {a or b for a, b in REPLY_TABLE.findall(code)}
    found |= set(RETURNED.findall(code))
    found |= {lit for name, lit in PUSHED.findall(code) if name in tables}
    found |= {int(x) for x in FLAG.findall(code)}
    found |= {int(x) for x in NEGATIVE.findall(code)}
    return found


def test_every_sentinel_a_script_answers_is_named_by_its_enum() -> None:
    scripts = SCRIPTS
    assert set(sc.REPLIES) <= {p.stem for p in scripts}
    unnamed = {}
    for p in scripts:
        named = {m.value for e in sc.REPLIES.get(p.stem, ()) for m in e}  # type: ignore[attr-defined]
        found = sentinels_in(_script_text(p), p.read_text())
        if found - named:
            unnamed[p.stem] = found - named
    assert unnamed == {}


def test_the_sentinel_scan_sees_each_form() -> None:
    """The scan above finds each way a script answers a sentinel (it cannot pass by finding
    nothing)."""
    read = {p.stem: sentinels_in(_script_text(p), p.read_text()) for p in SCRIPTS}
    assert {"ok", "paused", "no_streams"} <= read["claim"]  # header
    assert read["fail"] >= {"scheduled", "failed", "cancelled", "stale", "queued"}  # header
    assert read["schedule_fire"] == {"fired", "overlap", "missed", "stale"}
    assert read["touch"] == {"|"}  # pushed on the reply table
    assert read["flow_cancel"] == {""} and read["lock"] == {0, 1} and read["promote"] == {-1}
    assert read["dlq_discard"] == {"discarded", "missing"} and "-" not in read["purge"]
    assert read["cancel"] == {"cancelled", "requested", "unchanged", "missing"}
    fake = "-- Returns  1 or 'odd'\n\nif x then return 'new' end\nout[#out + 1] = 'pushed'\n"
    fake += (
        "local function f()\n  local function h()\n    return 'no'\n  end\n  return 'kept'\nend\n"
    )
    fake += "local function g()\n  return 'not'\nend\nw[#w + 1] = 'no'\nreturn {now, -7}\n"
    got = sentinels_in(fake + "return 3\nreturn out\nreturn f()", fake)
    assert got == {"odd", "new", "pushed", "kept", -7, 3}


def _task(prio: int) -> sc.NewTask:
    from dtq.store.keys import new_tid

    return sc.NewTask(new_tid(), "t", "[]", "", prio, 3, None, 0, 0, "", "")


BASE_QUEUED = {Field.NAME, Field.ARGS, Field.ENQUEUED, Field.STATUS, Field.ENTRY_ID}


def test_a_plain_record_holds_exactly_the_base_fields(r: redis.Redis, qk: QueueKeys) -> None:
    """A plain task's record holds exactly the base fields (5 queued, 8 running) and any option
    makes it longer: the record's size per task (workload F) depends on it."""
    from tests.conftest import create_groups

    create_groups(r, qk)
    run = sc.SyncScripts(r).run
    plain, opt = _task(5), _task(5)
    opt.kwargs = '{"a":1}'
    run(sc.enqueue_call(qk, [plain, opt], 100))
    assert set(r.hkeys(qk.task(plain.tid))) == {f.value for f in BASE_QUEUED}
    assert r.hlen(qk.task(opt.tid)) == 6
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 10, 100, 60)))
    runs = {c.tid: c for c in batch.runs}
    assert runs[opt.tid].kwargs == '{"a":1}' and runs[plain.tid].kwargs == ""
    running = BASE_QUEUED | {Field.WORKER, Field.STARTED, Field.ATTEMPT}
    assert set(r.hkeys(qk.task(plain.tid))) == {f.value for f in running}
    # The claim's reply fills in the defaults the record left out.
    c = runs[plain.tid]
    assert (c.attempt, c.priority, c.max_retries, c.retries, c.interruptions) == (1, 5, 3, 0, 0)
    # A cancel requested meanwhile makes another field: the outcome write reads it.
    sc.SyncScripts(r).run(
        sc.cancel_call(qk, plain.tid, events_maxlen=0, ttl_s=60, hint_channel="h", reason="stop")
    )
    c = runs[plain.tid]
    done = sc.Success(c.tid, c.eid, c.attempt, "cancelled", "generic")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [done], 100, 60))) == [True]
    assert r.hget(qk.task(plain.tid), Field.ERROR) == "stop"


# --- records leave their defaults out; every step reads them as the defaults -------------------

DEFAULT_FIELDS = {"attempt", "retries", "intr", "maxr", "prio"}


def _stored(r: redis.Redis, settings: Settings, task_id: str) -> dict[str, str]:
    queue, tid = task_id.split(":", 1)
    return r.hgetall(QueueKeys(settings.key_prefix, queue).task(tid))  # type: ignore[return-value]


@pytest.mark.cluster
def test_the_sdk_writes_records_without_their_defaults(settings: Settings, r: redis.Redis) -> None:
    with Client(settings=settings, app=basic_app) as c:
        plain = c.enqueue("noop")
        given = c.enqueue("noop", priority=7, max_retries=1)
        many = c.enqueue_many([{"name": "noop"}, {"name": "noop", "priority": 2}])
        assert set(_stored(r, settings, plain.id)) == {"name", "args", "enq", "status", "eid"}
        assert DEFAULT_FIELDS.isdisjoint(_stored(r, settings, many[0].id))
        assert _stored(r, settings, given.id)["prio"] == "7"
        assert _stored(r, settings, given.id)["maxr"] == "1"
        assert _stored(r, settings, many[1].id)["prio"] == "2"
        info = c.get(plain.id)
        assert (info.priority, info.max_retries, info.attempt, info.retries) == (5, 3, 0, 0)
        assert info.interruptions == 0 and info.retries_left == 3


async def test_records_without_their_defaults_run_retry_fail_and_succeed(
    settings: Settings, r: redis.Redis
) -> None:
    from tests.conftest import running_worker

    async with AsyncClient(settings=settings, app=basic_app) as c:
        flaky = await c.enqueue("flaky", args=[1])  # fails once, then returns its attempt
        dead = await c.enqueue("always_fails")  # max_retries=2
        none = await c.enqueue("noop")
        low = await c.enqueue("add", args=[2, 3], priority=0)
        assert "attempt" not in _stored(r, settings, none.id)
        async with running_worker(basic_app, settings):
            assert await c.result(flaky.id, timeout=20) == 2
            with pytest.raises(TaskFailed):
                await c.result(dead.id, timeout=20)
            assert await c.result(none.id, timeout=20) is None
            assert await c.result(low.id, timeout=20) == 5
        info = await c.get(flaky.id)
        assert (info.attempt, info.retries, info.max_retries) == (2, 1, 3)
        info = await c.get(dead.id)
        assert (info.status, info.attempt, info.retries, info.max_retries) == ("failed", 3, 3, 2)
        assert "result" not in _stored(r, settings, none.id)  # a null result is not stored
        assert _stored(r, settings, low.id)["result"] == "5"
        assert (await c.get(low.id)).priority == 0


def test_the_defaults_a_record_leaves_out_agree_in_python_and_lua() -> None:
    from dtq.sdk.requests import DEFAULT_MAX_RETRIES, DEFAULT_PRIORITY
    from dtq.store.record import DEFAULTS

    common = (ROOT / "lua" / "includes" / "record_defaults.lua").read_text()
    m = re.search(r"^local DEF_MAXR, DEF_PRIO = '(\d+)', '(\d+)'$", common, re.M)
    assert m is not None
    assert DEFAULTS[Field.MAX_RETRIES] == m.group(1) == str(DEFAULT_MAX_RETRIES)
    assert DEFAULTS[Field.PRIORITY] == m.group(2) == str(DEFAULT_PRIORITY)
    assert {DEFAULTS[f] for f in (Field.ATTEMPT, Field.RETRIES, Field.INTERRUPTIONS)} == {"0"}


# --- Python code names record fields by Field ---------------------------------------------------

HASH_COMMANDS = {"hget", "hmget", "hset", "hdel", "hexists", "hincrby", "hsetnx", "hgetall"}
RECORD_NAMES = {"rec", "recs"}  # what the code calls a task record it read (a dict, or a list)


def _is_record_key(node: ast.expr) -> bool:
    """``<keys>.task(tid)`` or ``<keys>.task_base + tid``: a task record's key."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "task"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return isinstance(node.left, ast.Attribute) and node.left.attr == "task_base"
    return False


def _literals(nodes: list[ast.expr]) -> list[ast.Constant]:
    out: list[ast.Constant] = []
    for n in nodes:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n)
        elif isinstance(n, ast.List | ast.Tuple | ast.Set):
            out += _literals(n.elts)
        elif isinstance(n, ast.Dict):
            out += _literals([k for k in n.keys if k is not None])
    return out


def _is_record(node: ast.expr, records: set[str]) -> bool:
    if isinstance(node, ast.Subscript):  # recs[i]
        node = node.value
    return isinstance(node, ast.Name) and node.id in records


def raw_record_fields(source: str) -> list[tuple[int, str]]:
    """(line, literal) of each raw record-field string used as a task record's field:
    - an argument of a hash command (hget, hmget, hset with its mapping, hdel, ...) on a task
      record's key (``qk.task(tid)``, ``qk.task_base + tid``);
    - a subscript, ``.get()``/``.pop()`` or ``in`` test on a task record read: a variable
      assigned from HGETALL of a record key, or named ``rec``/``recs`` (the code's name for one);
    - a key of a dict literal assigned to ``rec`` (a record-shaped dict).
    It cannot see a record under another name or a key passed through a variable (a pipeline's
    loop over record keys): those read as any dict or hash."""
    found: list[tuple[int, str]] = []
    values = {f.value for f in Field}
    tree = ast.parse(source)
    records = set(RECORD_NAMES)
    for node in ast.walk(tree):  # names assigned from HGETALL of a record key
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            calls = [c for c in ast.walk(node.value) if isinstance(c, ast.Call)]
            if any(
                isinstance(c.func, ast.Attribute) and c.func.attr == "hgetall" and c.args
                and _is_record_key(c.args[0]) for c in calls
            ):  # fmt: skip
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                records |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        lits: list[ast.Constant] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            fn = node.func
            if fn.attr in HASH_COMMANDS and node.args and _is_record_key(node.args[0]):
                lits = _literals([*node.args[1:], *(k.value for k in node.keywords)])
            elif fn.attr in ("get", "pop") and node.args and _is_record(fn.value, records):
                lits = _literals(node.args[:1])
        elif isinstance(node, ast.Subscript) and _is_record(node.value, records):
            lits = _literals([node.slice])
        elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops):
            if any(_is_record(c, records) for c in node.comparators):
                lits = _literals([node.left])
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Dict)
            and any(_is_record(t, records) for t in node.targets)
        ):
            lits = _literals([node.value])
        found += [(c.lineno, c.value) for c in lits if c.value in values]
    return sorted(set(found))


def test_python_code_names_record_fields_by_field() -> None:
    """Code under libs/ and apps/ names a task record's fields by Field (dtq/store/record.py), never
    by a raw string: a renamed or mistyped field is then an error at import, not a None."""
    raw = {}
    for path in sorted([*(ROOT / "libs").rglob("*.py"), *(ROOT / "apps").rglob("*.py")]):
        found = raw_record_fields(path.read_text())
        if found:
            raw[str(path.relative_to(ROOT))] = found
    assert raw == {}


def test_the_record_field_scan_sees_each_form() -> None:
    code = """
r.hget(qk.task(tid), "status")
pipe.hmget(self.keys.queue(q).task(tid), ["name", "maxr"])
r.hset(qk.task_base + tid, mapping={"lk": "x", "other": 1})
rec = await r.hgetall(qk.task(tid))
x = rec["prio"], rec.get("intr"), "tb" in rec, recs[0].get("hdr")
got = r.hgetall(qk.task(tid))
got.pop("lrn")
rec = {"lrw": "1"}
r.hget(qk.task(tid), Field.STATUS)
r.hget(keys.worker(wid), "status")
other = {"status": 1}
other.get("name")
"""
    got = raw_record_fields(code)
    assert sorted(v for _, v in got) == sorted(
        ["status", "name", "maxr", "lk", "prio", "intr", "tb", "hdr", "lrn", "lrw"]
    )
