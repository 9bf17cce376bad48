"""Workflows: chains, groups and chords of tasks (docs/workflows.md).

:func:`plan` checks and encodes a whole flow before anything is sent and turns the tree into
steps that wait for one another, each with its *input* (JSON of step indices) put first in its
arguments at its release; ``lua/flow_enqueue.lua`` creates the flow in one call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from dtq import codec
from dtq import scripts as sc
from dtq.errors import InvalidRequest
from dtq.middleware import EnqueueRequest
from dtq.scripts import Call, NewTask
from dtq.sdk.requests import TaskDefaults, build_task
from dtq.settings import Settings
from dtq.store.keys import Keys, new_flow_tid, split_task_id
from dtq.store.partitions import logical
from dtq.store.record import Field

__all__ = ["Chain", "Chord", "Flow", "Group", "Sig", "chain", "chord", "group", "sig"]

# Enqueue options a step may carry (an idempotency key would answer with another flow's task).
STEP_OPTIONS = frozenset(
    {"queue", "priority", "delay", "max_retries", "timeout", "expires", "metadata", "group"}
)


@dataclass(frozen=True, slots=True)
class Sig:
    """One step: a task name, its arguments and enqueue options (``queue``, ``priority``,
    ``delay``, ``max_retries``, ``timeout``, ``expires``, ``metadata``, ``group``; a delay or
    expiry counts from the step's release)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    defaults: TaskDefaults | None = None
    """The task's declared defaults, when made by ``task.s`` (as ``task.enqueue`` uses)."""


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps one after another; each gets the result of the one before as its first argument."""

    steps: tuple[Flow, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """Members run in parallel; the group's result is the list of their results, in order."""

    members: tuple[Flow, ...]


@dataclass(frozen=True, slots=True)
class Chord:
    """A group, then a callback that gets the list of the group's results first."""

    header: Group
    body: Flow


Flow: TypeAlias = Sig | Chain | Group | Chord


def sig(
    name: str, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None, **options: Any
) -> Sig:
    """A step of task ``name`` (by name; ``task.s(...)`` is the typed form)."""
    bad = set(options) - STEP_OPTIONS
    if bad:
        raise InvalidRequest(
            f"option(s) not allowed in a workflow step: {', '.join(sorted(bad))} "
            f"(allowed: {', '.join(sorted(STEP_OPTIONS))})"
        )
    if isinstance(args, str | bytes) or not isinstance(args, Iterable):
        raise InvalidRequest("args must be a list or tuple")
    return Sig(name, tuple(args), kwargs, dict(options))


def _flows(items: tuple[Any, ...], what: str) -> tuple[Flow, ...]:
    for x in items:
        if not isinstance(x, Sig | Chain | Group | Chord):
            raise InvalidRequest(f"{what} takes signatures and flows, not {type(x).__name__}")
    if not items:
        raise InvalidRequest(f"an empty {what}")
    return items


def chain(*steps: Flow) -> Chain:
    return Chain(_flows(steps, "chain"))


def group(*members: Flow) -> Group:
    if len(members) == 1 and isinstance(members[0], list | tuple):
        members = tuple(members[0])  # group([...]) as well as group(a, b)
    return Group(_flows(members, "group"))


def chord(header: Group | Iterable[Flow], body: Flow) -> Chord:
    g = header if isinstance(header, Group) else group(*header)
    _flows((body,), "chord")
    return Chord(g, body)


# --- the plan -----------------------------------------------------------------------------

Expr: TypeAlias = "int | list[Expr]"


@dataclass(slots=True)
class Step:
    queue: str
    task: NewTask
    input: Expr | None
    waits: int
    dependents: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    ftid: str
    home: str
    steps: list[Step]
    root: Expr
    tree: Any

    @property
    def id(self) -> str:
        return f"{self.home}:{self.ftid}"


def build_request(
    settings: Settings, req: EnqueueRequest, defaults: TaskDefaults | None
) -> tuple[str, NewTask]:
    """The task of a request as ``before_enqueue`` middleware left it."""
    return build_task(
        settings, req.name, req.args, req.kwargs, defaults=defaults, queue=req.queue,
        metadata=req.metadata or None, headers=req.headers or None, **req.options,
    )  # fmt: skip


def _deps(e: Expr | None, out: set[int]) -> set[int]:
    if isinstance(e, int):
        out.add(e)
    elif e is not None:
        for x in e:
            _deps(x, out)
    return out


def sigs(flow: Flow) -> list[Sig]:
    """The signatures of ``flow`` in step order (the order of :func:`plan`'s steps)."""
    if isinstance(flow, Sig):
        return [flow]
    if isinstance(flow, Chain | Group):
        return [
            s for x in (flow.steps if isinstance(flow, Chain) else flow.members) for s in sigs(x)
        ]
    if isinstance(flow, Chord):
        return [*sigs(flow.header), *sigs(flow.body)]
    raise InvalidRequest(f"not a workflow: {type(flow).__name__}")


def plan(
    flow: Flow,
    settings: Settings,
    defaults_for: Any = None,
    ftid: str | None = None,
    requests: list[EnqueueRequest] | None = None,
) -> Plan:
    """Check and encode ``flow``; raise :class:`dtq.InvalidRequest` (or a serialization
    error) before anything is sent. ``defaults_for(name)``: the app's declared defaults.
    ``requests``: each step's request as ``before_enqueue`` middleware left it (in the order
    of :func:`sigs`); a step is then built from its request (metadata and headers included)."""
    steps: list[Step] = []

    def walk(node: Flow, inp: Expr | None) -> tuple[Expr, Any]:
        if isinstance(node, Sig):
            d = node.defaults
            if d is None and defaults_for is not None:
                d = defaults_for(node.name)
            if requests is None:
                q, t = build_task(
                    settings, node.name, list(node.args), node.kwargs, defaults=d, **node.options
                )
            else:
                q, t = build_request(settings, requests[len(steps)], d)
            if t.idempotency_key or t.limit:
                raise InvalidRequest(
                    f"step {node.name!r}: unique tasks and limits are not supported in workflows"
                )
            i = len(steps)
            deps = _deps(inp, set())
            # (on its queue's partition 0: a flow's keys stay on its home's slot)
            steps.append(Step(logical(q), t, inp, len(deps)))
            for d_ in deps:
                steps[d_].dependents.append(i)
            return i, i
        if isinstance(node, Chain):
            cur, trees = inp, []
            for s in node.steps:
                cur, tr = walk(s, cur)
                trees.append(tr)
            assert cur is not None
            return cur, {"chain": trees}
        if isinstance(node, Group):
            walked = [walk(m, inp) for m in node.members]
            return [e for e, _ in walked], {"group": [tr for _, tr in walked]}
        if isinstance(node, Chord):
            h, htree = walk(node.header, inp)
            b, btree = walk(node.body, h)
            return b, {"chord": [htree, btree]}
        raise InvalidRequest(f"not a workflow: {type(node).__name__}")

    root, tree = walk(flow, None)
    return Plan(ftid or new_flow_tid(), steps[0].queue, steps, root, tree)


def _spec(keys: Keys, p: Plan, i: int) -> str:
    s = p.steps[i]
    t = s.task
    qk = keys.queue(s.queue)
    timeout = "" if t.timeout is None else repr(float(t.timeout))
    flow = f"{keys.queue(p.home).flow(p.ftid)}|{i}"
    head = [s.queue, t.tid, t.name, t.args, t.kwargs, str(t.priority), str(t.max_retries), timeout]
    tail = [str(t.delay_ms), str(t.expires_ms), t.meta, flow, qk.task_base, t.headers, t.group]
    return codec.dumps([*head, *tail, t.unset], "workflow step")


def enqueue_call(
    keys: Keys, p: Plan, events_maxlen: int, max_payload: int = 1_048_576
) -> tuple[Call, list[tuple[str, str]]]:
    """flow_enqueue.lua's call; and (queue, spec) of each first step on another queue, for the
    client to move at once (:func:`dtq.scripts.flow_put_call`)."""
    root, tree = (json.dumps(x, separators=(",", ":")) for x in (p.root, p.tree))
    head: list[Any] = [events_maxlen, p.ftid, len(p.steps), root, tree, max_payload]
    args: list[Any] = []
    away: list[tuple[str, str]] = []
    for i, s in enumerate(p.steps):
        spec = _spec(keys, p, i)
        inp = "" if s.input is None else json.dumps(s.input, separators=(",", ":"))
        args += [f"{s.queue}:{s.task.tid}", s.waits, ",".join(map(str, s.dependents)), inp, spec]
        if s.waits == 0 and s.queue != p.home:
            away.append((s.queue, spec))
    return sc.flow_enqueue_call(keys.queue(p.home), head, args), away


def handover_call(keys: Keys, settings: Settings, fields: Mapping[str, str]) -> Call | None:
    """The move of one outbox entry (``P:{q}:flowq``): ``flow_apply`` of a ``note`` at its
    flow's home, ``flow_put`` of a ``put`` on its step's queue; None for an unknown kind."""
    kind = fields.get("k")
    if kind == "note":
        home, ftid, step = parse_flow_key(keys.prefix, fields["f"])
        status = fields["s"]
        s = settings
        ttl = s.result_ttl_s if status == "succeeded" else max(s.result_ttl_s, s.dlq_ttl_s)
        return sc.flow_apply_call(
            keys.queue(home), ftid, step, status, fields["p"], settings.events_maxlen, ttl
        )
    if kind == "put":
        queue = json.loads(fields["spec"])[0]
        qk = keys.queue(queue)
        return sc.flow_put_call(qk, fields["spec"], fields["args"], settings.events_maxlen)
    return None


def put_marker(keys: Keys, fields: Mapping[str, str]) -> str | None:
    """The put marker (``P:{q}:fput:<tid>``) of a ``put`` outbox entry, else None (the mover
    gives it a TTL once the entry is acknowledged)."""
    if fields.get("k") != "put":
        return None
    spec = json.loads(fields["spec"])
    return keys.queue(spec[0]).flow_put(spec[1])


def parse_flow_key(prefix: str, flow_field: str) -> tuple[str, str, str]:
    """(home queue, ftid, step index) of a step record's ``flow`` field."""
    fkey, _, step = flow_field.rpartition("|")
    parts = Keys(prefix).flow_key_parts(fkey)
    if parts is None:
        raise ValueError(f"not a flow key: {fkey!r}")
    return parts[0], parts[1], step


# --- what get() shows ---------------------------------------------------------------------


def flow_record(task_id: str, fh: dict[str, str], step_recs: list[Any]) -> dict[str, Any]:
    """The flow as a task-like record, plus its steps (index, id, name, status) and tree.
    ``step_recs``: [status, name] of each step's task record (None: not created yet)."""
    split_task_id(task_id)
    st = fh.get("status", "running")
    waiting = ("queued", "scheduled", None)
    if st == "running" and all((x or [None])[0] in waiting for x in step_recs):
        st = "queued"  # (running once a step started)
    steps = []
    for i, x in enumerate(step_recs):
        status, name = (x if x else [None, None])[:2]
        if name is None and f"x{i}" in fh:
            name = json.loads(fh[f"x{i}"])[2]
        if status is None and f"e{i}" in fh:  # refused at its release (payload limit)
            status = "failed"
        sid = fh.get(f"q{i}", "")
        steps.append({"index": i, "id": sid, "name": name or "", "status": status or "waiting"})
    return {
        "status": st,
        "rec": {  # the flow as a task record (its hash shares these names)
            Field.NAME: "workflow",
            Field.STATUS: st,
            Field.ENQUEUED: fh.get("enq", ""),
            **{f: fh[f] for f in (Field.FINISHED, Field.RESULT, Field.ERROR) if f in fh},
        },
        "steps": steps,
        "tree": json.loads(fh.get("tree", "null")),
    }


def render_tree(tree: Any, steps: list[dict[str, Any]]) -> list[str]:
    """The lines ``dtq task FLOW_ID`` prints: the flow's shape with each step's status."""
    out: list[str] = []

    def walk(node: Any, pre: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        if isinstance(node, int):
            s = steps[node]
            out.append(f"{pre}{branch}[{s['index']}] {s['name']} {s['status']}  {s['id']}")
            return
        ((kind, kids),) = node.items()
        out.append(f"{pre}{branch}{kind}")
        inner = pre + ("" if top else ("   " if last else "│  "))
        for j, k in enumerate(kids):
            walk(k, inner, j == len(kids) - 1, False)

    walk(tree, "", True, True)
    return out
