"""The state machine of the model test (tests/model/test_state_machine.py): random sequences of
dtq's transitions, each made through the call the product makes (``dtq.scripts``), any of them
losing its reply or answered with an error instead of running, and the invariants of
docs/design.md ("Invariants the model checks") checked after every step.

The model knows only what a caller knows: the tasks it enqueued (their limit key, their
deadline), the runs each worker holds (from the replies it got), the cancels it asked for, and
the log of starts. Everything else is read from Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dtq import scripts as sc
from dtq.admin.common import RETRYABLE
from dtq.store.keys import GROUP_MARK, QueueKeys, new_tid
from tests.conftest import create_groups
from tests.model.harness import (
    ERROR_REPLIES,
    ClockedScripts,
    ErrorReply,
    Fault,
    ReplyLost,
    Snapshot,
    snapshot,
)

Q = "mq"
WORKERS = ("w1", "w2")
LIMITS = {"k1": 1, "k2": 2}  # limit key -> concurrency
GROUPS = ("a", "b")  # fair groups (docs/groups.md); "" is no group
MAXLEN = 10_000
TTL_S = 86_400
MAX_INTERRUPTIONS = 1
VISIBILITY_MS = 30_000
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
WAITING = frozenset({"queued", "scheduled", "running"})
ENDED_BADLY = frozenset({"failed", "cancelled", "expired"})

# Mostly replies that come (the first, what Hypothesis shrinks to), then lost replies, then
# each error reply.
faults = st.sampled_from([*[Fault.NONE] * 14, Fault.LOST, Fault.LOST, *ERROR_REPLIES])


@dataclass
class TaskModel:
    deadline: int | None  # ms of the model clock, None: never expires
    lk: str


class Violation(AssertionError):
    pass


class DtqModel(RuleBasedStateMachine):
    """Set ``DtqModel.r`` (a client of a private redis-server, decode_responses) first."""

    r: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.r.flushdb()
        self.scripts = ClockedScripts(self.r)
        self.qk = QueueKeys("m", Q)
        create_groups(self.r, self.qk)
        self.tasks: dict[str, TaskModel] = {}
        self.held: dict[str, dict[str, sc.Claimed]] = {w: {} for w in WORKERS}
        self.since: dict[str, int] = {w: self.scripts.now_ms() for w in WORKERS}
        self.recovery_owed: dict[str, bool] = dict.fromkeys(WORKERS, False)
        self.started: set[tuple[str, int]] = set()
        self.cancel_asked: set[str] = set()
        self.paused = False
        self.gcap = 0  # DTQ_GROUP_CONCURRENCY of the queue (set by start)
        self.held_groups: set[str] = set()

    # --- calls -----------------------------------------------------------------------------

    def call(self, c: sc.Call, fault: Fault, resend: bool) -> Any:
        """Run ``c`` under ``fault``; on a lost reply, send it again when the product does
        (``resend``) and answer that reply, else raise ReplyLost. An error reply raises."""
        try:
            return self.scripts.run(c, fault)
        except ReplyLost:
            if not resend:
                raise
            return self.scripts.run(c)

    def launch(self, w: str, batch: sc.ClaimBatch, paused: set[str] | None = None) -> None:
        """The worker starts the runs a claim (or recovery) answered: invariant 1. ``paused``:
        the fair groups paused when the claim was sent (none of them starts a task)."""
        if batch.missing_streams:
            create_groups(self.r, self.qk)
        for c in batch.runs:
            if c.tid in self.held[w] and self.held[w][c.tid].attempt == c.attempt:
                continue  # Worker.launch refuses a run it holds
            if (c.tid, c.attempt) in self.started:
                raise Violation(f"{c.tid} attempt {c.attempt} started twice")
            if paused and self.r.hget(self.qk.task(c.tid), "grp") in paused:
                raise Violation(f"{c.tid} started while its group was paused ({paused})")
            self.started.add((c.tid, c.attempt))
            self.held[w][c.tid] = c

    def record(self, tid: str) -> dict[str, str]:
        return self.r.hgetall(self.qk.task(tid))

    def pick(self, items: list[str], i: int) -> str | None:
        """The i-th (modulo) of ``items``, in the order the model met them (task ids are
        random: an order by id would differ when Hypothesis replays a sequence)."""
        return items[i % len(items)] if items else None

    def pick_run(self, i: int) -> tuple[str, str]:
        runs = [(w, tid) for w in WORKERS for tid in self.held[w]]
        return runs[i % len(runs)]

    def pick_task(self, i: int, statuses: frozenset[str] | None) -> str | None:
        """The i-th task (modulo) of those whose record has one of ``statuses`` (None: any):
        operators act on tasks they see, which keeps the search away from no-ops."""
        if statuses is None:
            return self.pick(list(self.tasks), i)
        live = [t for t in self.tasks if self.r.hget(self.qk.task(t), "status") in statuses]
        return self.pick(live, i)

    # --- rules -----------------------------------------------------------------------------

    @initialize(gcap=st.sampled_from([0, 1, 2]))
    def start(self, gcap: int) -> None:
        self.gcap = gcap

    @rule(
        n=st.integers(1, 3),
        delay=st.sampled_from([0, 0, 10_000]),
        expires=st.sampled_from([0, 0, 5_000, 30_000]),
        idem=st.sampled_from(["", "", "a"]),
        lk=st.sampled_from(["", "k1", "k2"]),
        maxr=st.sampled_from([0, 1, 3]),
        prio=st.sampled_from([5, 9]),
        grp=st.sampled_from(["", "", "a", "b"]),
        fault=faults,
    )
    def enqueue(
        self, n: int, delay: int, expires: int, idem: str, lk: str, maxr: int, prio: int,
        grp: str, fault: Fault,
    ) -> None:  # fmt: skip
        new = [
            sc.NewTask(
                tid=new_tid(),
                name="t",
                args="[]",
                kwargs="",
                priority=prio,
                max_retries=maxr,
                timeout=None,
                delay_ms=delay,
                expires_ms=expires,
                idempotency_key=idem if i == 0 else "",
                meta="",
                limit=f"{LIMITS[lk]}|0|0|{lk}" if lk else "",
                group=grp,
            )
            for i in range(n)
        ]
        try:  # the SDK re-sends a call whose reply was lost (the same task ids)
            got = sc.parse_enqueue(self.call(sc.enqueue_call(self.qk, new, MAXLEN), fault, True))
        except ErrorReply:
            return
        for t, e in zip(new, got, strict=True):
            if e.created:  # (the deadline counts from the server's time of the enqueue)
                assert e.tid == t.tid
                exp = self.r.hget(self.qk.task(t.tid), "exp") if expires else None
                self.tasks[t.tid] = TaskModel(int(exp) if exp else None, lk)

    @rule(
        n=st.sampled_from([3, 2, 1]), lk=st.sampled_from(["k1", "k1", "k2"]),
        expires=st.sampled_from([0, 0, 5_000, 30_000]), maxr=st.sampled_from([0, 1]), fault=faults,
    )  # fmt: skip
    def enqueue_limited(self, n: int, lk: str, expires: int, maxr: int, fault: Fault) -> None:
        """enqueue of tasks under a fleet limit, no delay (its own rule: limits need several)."""
        self.enqueue(n, 0, expires, "", lk, maxr, 5, "a", fault)

    @rule(w=st.sampled_from(WORKERS), count=st.sampled_from([3, 2, 1]), fault=faults)
    def claim(self, w: str, count: int, fault: Fault) -> None:
        if self.recovery_owed[w]:
            return  # no claim of the queue is sent while its recovery is pending
        paused = set(self.r.smembers(self.qk.group_paused))
        try:
            call = sc.claim_call(self.qk, w, count, MAXLEN, TTL_S, group_cap=self.gcap)
            raw = self.call(call, fault, False)
        except ReplyLost:
            self.recovery_owed[w] = True  # AsyncScripts.on_reply_lost
            return
        except ErrorReply:
            return
        self.launch(w, sc.parse_claim(Q, raw), paused)

    @precondition(lambda self: any(self.recovery_owed.values()))
    @rule(w=st.sampled_from(WORKERS), fault=faults)
    def recover(self, w: str, fault: Fault) -> None:
        known = [(c.priority, c.eid) for c in self.held[w].values()]
        c = sc.recover_call(self.qk, w, known, events_maxlen=MAXLEN, since_ms=self.since[w])
        try:
            raw = self.call(c, fault, False)
        except (ReplyLost, ErrorReply):
            return  # still owed: the next tick tries again
        self.recovery_owed[w] = False
        self.launch(w, sc.parse_claim(Q, raw))

    @rule(
        pick=st.integers(0, 7), both=st.booleans(), refill=st.sampled_from([0, 0, 1]), fault=faults
    )
    @precondition(lambda self: any(self.held.values()))
    def complete(self, pick: int, both: bool, refill: int, fault: Fault) -> None:
        """The outcome of the pick-th held run (``both``: of all its worker's runs)."""
        w, tid = self.pick_run(pick)
        runs = list(self.held[w].values()) if both else [self.held[w][tid]]
        if refill and self.recovery_owed[w]:
            refill = 0  # the outcome writer's refill skips the claim while recovery is pending
        outs = [
            sc.Success.of(c, "cancelled" if c.tid in self.cancel_asked else "succeeded", "1")
            for c in runs
        ]
        call = sc.complete_call(self.qk, w, outs, MAXLEN, TTL_S, claim=refill, group_cap=self.gcap)
        paused = set(self.r.smembers(self.qk.group_paused))
        try:  # the outcome writer re-sends; a refill's claim may have run: recovery
            if fault is Fault.LOST and refill:
                self.recovery_owed[w] = True
            raw = self.call(call, fault, True)
        except ErrorReply:
            return  # the run stays held; its outcome is written later
        _, batch = sc.parse_complete_claim(Q, raw)
        for c in runs:
            del self.held[w][c.tid]
        if batch is not None:
            self.launch(w, batch, paused)

    @rule(pick=st.integers(0, 7), delay=st.sampled_from([None, 0, 10_000]), fault=faults)
    @precondition(lambda self: any(self.held.values()))
    def fail(self, pick: int, delay: int | None, fault: Fault) -> None:
        """The pick-th held run fails (``delay`` None: no retry allowed, a ``Fail``)."""
        w, tid = self.pick_run(pick)
        c = self.held[w][tid]
        f = sc.Failure(c.tid, c.eid, c.attempt, "E: boom", delay)
        try:
            self.call(sc.fail_call(self.qk, w, [f], MAXLEN, TTL_S), fault, True)
        except ErrorReply:
            return
        del self.held[w][tid]

    def shutdown(self, w: str, started: bool, fault: Fault) -> None:
        """Hand every held run back (requeue.lua), then the worker starts again."""
        if self.recovery_owed[w] or not self.held[w]:
            return  # the shutdown's recovery runs first (see recover)
        refs = [sc.RunRef(c.tid, c.eid, c.attempt) for c in self.held[w].values()]
        call = sc.requeue_call(
            self.qk, w, refs, events_maxlen=MAXLEN, ttl_s=TTL_S,
            max_interruptions=MAX_INTERRUPTIONS, retry_delay_ms=0, started=started,
        )  # fmt: skip
        try:
            self.call(call, fault, True)
        except ErrorReply:
            return  # retried until the deadline; here: the runs stay held
        self.held[w].clear()
        self.since[w] = self.scripts.now_ms()

    @precondition(lambda self: self.tasks)
    @rule(pick=st.integers(0, 15), fault=faults)
    def cancel(self, pick: int, fault: Fault) -> None:
        tid = self.pick_task(pick, WAITING)
        if tid is None:
            return
        call = sc.cancel_call(
            self.qk, tid, events_maxlen=MAXLEN, ttl_s=TTL_S, hint_channel="m:cancel",
            reason="stop", nonce=sc.new_nonce(),
        )  # fmt: skip
        try:
            res = sc.parse_cancel(self.call(call, fault, True))
        except ErrorReply:
            return
        if res.outcome is sc.CancelOutcome.REQUESTED:
            self.cancel_asked.add(tid)

    def heartbeat(self, w: str, fault: Fault) -> None:
        refs = [sc.RunRef(c.tid, c.eid, c.attempt) for c in self.held[w].values()]
        try:
            res = sc.parse_touch(self.call(sc.touch_call(self.qk, w, refs), fault, False))
        except (ReplyLost, ErrorReply):
            return
        for tid in res.lost:
            self.held[w].pop(tid, None)  # the run is stopped; no outcome is written
        self.cancel_asked.update(res.cancel_requested)

    def lease_lapses(self, pick: int) -> None:
        """One pending entry's lease lapses (its worker froze): its idle time passes the
        visibility timeout."""
        pend = sorted(self._pending())
        if not pend:
            return
        stream, eid, consumer = pend[pick % len(pend)]
        self.r.xclaim(stream, "workers", consumer, 0, [eid], idle=VISIBILITY_MS * 2, justid=True)

    def _pending(self) -> list[tuple[str, str, str]]:
        out = []
        for band in range(10):
            key = self.qk.stream(band)
            for p in self.r.xpending_range(key, "workers", "-", "+", 1000):
                out.append((key, p["message_id"], p["consumer"]))
        return out

    def reap(self, w: str, fault: Fault) -> None:
        """A reaper pass of worker w (reclaim.lua from band 1 until the pass is complete)."""
        band, cursor = 1, "0-0"
        for _ in range(20):
            c = sc.reclaim_call(
                self.qk, w, min_idle_ms=VISIBILITY_MS, count=10, events_maxlen=MAXLEN,
                ttl_s=TTL_S, band=band, cursor=cursor,
            )  # fmt: skip
            try:
                res = sc.parse_reclaim(self.call(c, fault, False))
            except (ReplyLost, ErrorReply):
                return  # the next pass
            if not res.more:
                return
            band, cursor = res.band, res.cursor

    def scheduler_tick(self, fault: Fault) -> None:
        """promote.lua, then the owed limit releases when it says so (scheduler.py)."""
        try:
            res = sc.parse_promote(self.call(sc.promote_call(self.qk, 100, MAXLEN), fault, False))
        except (ReplyLost, ErrorReply):
            return
        if res.owed:
            self._sweep([], Fault.NONE)

    def _sweep(self, keys: list[str], fault: Fault) -> None:
        for _ in range(10):
            try:
                raw = self.call(sc.limit_sweep_call(self.qk, keys), fault, False)
            except (ReplyLost, ErrorReply):
                return
            if not sc.parse_limit_sweep(raw).more:
                return

    def retention_sweep(self, fault: Fault) -> None:
        """The retention pass's limit_sweep.lua over the limit keys that have parked tasks."""
        keys = [lk for lk in LIMITS if self.r.exists(f"{self.qk.lim_base}{lk}:held")]
        if keys:
            self._sweep(keys, fault)

    def advance_clock(self, ms: int) -> None:
        self.scripts.advance(ms)

    def pause_or_resume(self) -> None:
        """dtq.admin's pause (the key) when the queue runs, its resume when it is paused."""
        if self.paused:
            self.r.delete(self.qk.paused)
        else:
            self.r.set(self.qk.paused, "1")
        self.paused = not self.paused

    def hold_group(self, pick: int, fault: Fault) -> None:
        """``dtq pause QUEUE --group G`` when G runs, its resume when it is paused."""
        g = GROUPS[pick % len(GROUPS)]
        keys = [*self.qk.streams, self.qk.group_base, self.qk.events]
        pause = g not in self.held_groups
        try:
            self.call(sc.Call("group_hold", keys, [g, "1" if pause else "0", MAXLEN]), fault, True)
        except ErrorReply:
            return
        self.held_groups ^= {g}

    def dlq_requeue(self, pick: int, retry: bool, maxr: int | None, fault: Fault) -> None:
        """``dtq retry`` (failed, cancelled or expired) or ``dtq dlq requeue`` (failed)."""
        tid = self.pick_task(pick, ENDED_BADLY)
        if tid is None:
            return
        allowed = RETRYABLE if retry else ("failed",)
        call = sc.dlq_requeue_call(
            self.qk, [tid], events_maxlen=MAXLEN, max_retries=maxr, allowed=allowed,
            nonce=sc.new_nonce(),
        )  # fmt: skip
        try:
            (v,) = sc.parse_dlq(self.call(call, fault, True))
        except ErrorReply:
            return
        if v is sc.DlqVerdict.REQUEUED:
            self.tasks[tid].deadline = None  # a task retried by hand gets a chance to run

    def dlq_discard(self, pick: int, fault: Fault) -> None:
        tid = self.pick_task(pick, ENDED_BADLY)
        if tid is None:
            return
        call = sc.dlq_discard_call(self.qk, [tid], events_maxlen=MAXLEN, nonce=sc.new_nonce())
        try:
            self.call(call, fault, True)
        except ErrorReply:
            return

    def purge(self, fault: Fault) -> None:
        """dtq.admin's purge: calls until it reports no more (each with its own nonce)."""
        for _ in range(10):
            call = sc.purge_call(self.qk, 100, MAXLEN, nonce=sc.new_nonce())
            try:
                batch = sc.parse_purge(self.call(call, fault, True))
            except ErrorReply:
                return
            if not batch.more:
                return

    # --- the rules that pick one of several steps (fewer rules: Hypothesis picks a rule
    # uniformly, and the core transitions above should come up often) ----------------------

    @precondition(lambda self: any(self.held.values()))
    @rule(pick=st.integers(0, 7), shutdown=st.booleans(), started=st.booleans(), fault=faults)
    def worker_beat_or_stop(self, pick: int, shutdown: bool, started: bool, fault: Fault) -> None:
        """The heartbeat (touch.lua) of a worker holding runs, or its shutdown hand-back."""
        w, _ = self.pick_run(pick)
        if shutdown:
            self.shutdown(w, started, fault)
        else:
            self.heartbeat(w, fault)

    @precondition(lambda self: self.tasks)
    @rule(pick=st.integers(0, 7), w=st.sampled_from(WORKERS), fault=faults)
    def lease_lost(self, pick: int, w: str, fault: Fault) -> None:
        """A pending entry's lease lapses, then worker w's reaper makes a pass."""
        self.lease_lapses(pick)
        self.reap(w, fault)

    @rule(
        kind=st.sampled_from(
            ["scheduler_tick", "advance_clock", "pause_or_resume", "retention", "hold_group"]
        ),
        ms=st.sampled_from([10_000, 1_000, 40_000]), fault=faults,
    )  # fmt: skip
    def housekeeping(self, kind: str, ms: int, fault: Fault) -> None:
        if kind == "hold_group":
            self.hold_group(ms, fault)
        elif kind == "scheduler_tick":
            self.scheduler_tick(fault)
        elif kind == "advance_clock":
            self.advance_clock(ms)
        elif kind == "pause_or_resume":
            self.pause_or_resume()
        else:
            self.retention_sweep(fault)

    @precondition(lambda self: self.tasks)
    @rule(
        kind=st.sampled_from(["retry", "dlq_requeue", "dlq_discard", "purge"]),
        pick=st.integers(0, 15), maxr=st.sampled_from([None, 1]), fault=faults,
    )  # fmt: skip
    def operator(self, kind: str, pick: int, maxr: int | None, fault: Fault) -> None:
        """``dtq retry``, ``dtq dlq requeue``, ``dtq dlq discard``, ``dtq queue purge``."""
        if kind == "purge":
            self.purge(fault)
        elif kind == "dlq_discard":
            self.dlq_discard(pick, fault)
        else:
            self.dlq_requeue(pick, kind == "retry", maxr, fault)

    # --- invariants (docs/design.md, "Invariants the model checks") -------------------------

    @invariant()
    def the_invariants_hold(self) -> None:
        s = snapshot(self.r, self.qk, list(self.tasks), list(LIMITS))
        for tid, rec in s.records.items():
            status = rec["status"]
            if status in TERMINAL:
                self._check_terminal(s, tid, rec)
            else:
                self._check_can_run(s, tid, rec)
            if status == "expired":
                self._check_expired(tid, rec)
            elif "exp" in rec and status not in TERMINAL and self.tasks[tid].deadline is None:
                raise Violation(f"task {tid} was retried by hand but keeps its deadline {rec}")
        self._check_places(s)
        self._check_groups(s)

    def _group_list(self, rec: dict[str, str]) -> list[str]:
        if "grp" not in rec:
            return []
        band = rec.get("prio", "5")
        return self.r.lrange(self.qk.group_waiting(int(band), rec["grp"]), 0, -1)

    def _check_groups(self, s: Snapshot) -> None:
        """Fair groups (docs/groups.md): each waiting group has exactly one way forward per
        band (a turn in the stream, or a turn withheld for a reason that will end), the running
        counts are exact, the cap holds, and an idle group leaves no key."""
        qk, r = self.qk, self.r
        # Each list's head is its group's turn in that band: a tid (live: its stream entry is
        # the turn) or "~" (withheld) in front of the task it holds back.
        lists: dict[str, list[str]] = {}
        for key in r.scan_iter(match=qk.group_base + "w:*"):
            lists[key[len(qk.group_base) + 2 :]] = r.lrange(key, 0, -1)
        turns = {f: ids[0] for f, ids in lists.items() if ids}
        active = set(r.zrange(qk.group_index, 0, -1))
        paused = set(r.smembers(qk.group_paused))
        running: dict[str, dict[str, int]] = {}
        waiting: dict[str, int] = {}
        for tid, rec in s.records.items():
            g = rec.get("grp")
            if g is None:
                continue
            if rec["status"] == "running":
                running.setdefault(g, {})[tid] = int(rec.get("attempt", "0"))
            elif rec["status"] == "queued" and ("eid" in rec or tid in self._group_list(rec)):
                waiting[g] = waiting.get(g, 0) + 1  # (not one parked behind a limit)
                # (A turn entry a task kept from before it ended and came back, dtq retry, starts
                # nothing while the task does not head its list: the claim absorbs it.)
                if g and "eid" in rec and turns.get(f"{rec.get('prio', '5')}:{g}") != tid:
                    raise Violation(f"task {tid} of group {g} has a stream entry but not the turn")
        raw = {
            m[len(qk.group_base) + 4 :]: int(r.get(m) or 0)
            for m in r.scan_iter(match=qk.group_base + "run:*")
        }
        counts = {g: v % GROUP_MARK for g, v in raw.items()}
        for g, v in raw.items():
            if v < 0:
                raise Violation(f"group {g!r} running count {v}")
            # (The end of the last run reads nothing more when the group is not marked: it must
            # still have a turn then. A turn that ended while the group ran marked it.)
            has_turn = any(f.split(":", 1)[1] == g for f in turns)
            if v < GROUP_MARK and running.get(g) and not has_turn:
                raise Violation(f"group {g!r} runs, has no turn left, and is not marked")
        for g in set(running) | set(counts):
            got, want = counts.get(g, 0), len(running.get(g, {}))
            if got != want:
                raise Violation(f"group {g!r} running count {got} != running tasks {want}")
            if g in counts and g not in active:  # (0 while active: it goes when the group does)
                raise Violation(f"group {g!r} has a running count {got} but is not active")
            if self.gcap and g and got > self.gcap:  # (no cap on tasks without a group)
                raise Violation(f"group {g!r} runs {got} tasks, over its cap {self.gcap}")
        for field, tid in turns.items():
            band, g = field.split(":", 1)
            ids = lists[field]
            if "~" in ids[1:]:
                raise Violation(f"group {g!r} band {band}: '~' inside its list {ids}")
            for t in ids[1:]:  # (a second copy of the head's task is dropped when met)
                if t != tid and "eid" in (s.records.get(t) or {}):
                    raise Violation(f"group {g!r} band {band}: {t} has an entry but not the turn")
            if tid == "~":
                if len(ids) < 2:
                    raise Violation(f"group {g!r} band {band}: a withheld turn and no task")
                live = any(t != "~" for f, t in turns.items() if f.split(":", 1)[1] == g)
                if g not in paused and not running.get(g) and not live:
                    raise Violation(
                        f"group {g!r} band {band}: turn withheld, nothing to give it back"
                    )
                continue
            rec = s.records.get(tid) or r.hgetall(qk.task(tid))
            mine = s.entries.get(tid, [])
            if "eid" in rec:  # (its entry from its enqueue or its return to waiting)
                live = (int(band), rec["eid"]) in mine
            else:  # (group_issue's: the record names none)
                live = any(e[0] == int(band) and e in s.turn_entries for e in mine)
            if rec.get("status") != "queued" or not live or any(e in s.pending for e in mine):
                raise Violation(f"group {g!r} band {band}: its turn {tid} is not in a stream {rec}")
        for g in active:
            if not waiting.get(g) and not running.get(g):
                raise Violation(f"group {g!r} is active with nothing waiting or running")
        # (Tasks without a group that were queued while no group was active wait in the stream
        # as ever; the claim makes each the '' group's turn or puts it in its list.)
        for g in (set(waiting) | set(running)) - {""}:
            if g not in active:
                raise Violation(f"group {g!r} has tasks but is not active ({active})")

    def _check_terminal(self, s: Snapshot, tid: str, rec: dict[str, str]) -> None:
        status = rec["status"]
        if s.entries.get(tid):
            for entry in s.entries[tid]:
                if entry in s.pending:
                    raise Violation(f"{status} task {tid} has a pending entry {entry}")
            # (A group's turn given to a task that then ended stays until a claim absorbs it.)
            if any(e not in s.turn_entries for e in s.entries[tid]):
                raise Violation(f"{status} task {tid} has a stream entry {s.entries[tid]}")
        if tid in s.sched:
            raise Violation(f"{status} task {tid} is in the schedule")
        for lk, places in s.run_sets.items():
            if tid in places:
                raise Violation(f"{status} task {tid} holds a place of limit {lk}")

    def _check_can_run(self, s: Snapshot, tid: str, rec: dict[str, str]) -> None:
        status, eid = rec["status"], rec.get("eid")
        entry = (int(rec.get("prio", "5")), eid or "")
        if status == "scheduled":
            if tid not in s.sched:
                raise Violation(f"scheduled task {tid} is not in the schedule")
        elif status == "running":
            if eid is None or entry not in s.pending:
                raise Violation(f"running task {tid} has no pending entry ({eid})")
        elif status == "queued" and eid is not None:
            if entry not in s.entries.get(tid, []):
                raise Violation(f"queued task {tid} has no stream entry ({eid})")
            if entry in s.pending:
                raise Violation(f"queued task {tid}'s entry {eid} is delivered already")
        elif status == "queued" and tid in self._group_list(rec):
            pass  # waiting in its group's list (the group invariants check the rest)
        elif status == "queued":
            lk = rec.get("lk", "")
            if tid not in s.held.get(lk, []):
                raise Violation(f"queued task {tid} has no entry and is not parked")
            if not self._key_moves(s, lk, tid):
                raise Violation(
                    f"task {tid} is parked behind limit {lk} and nothing will release it: "
                    f"no run holds a place ({s.run_sets[lk]}), no release is owed, no other "
                    f"task of the key is waiting in a stream or the schedule"
                )

    def _key_moves(self, s: Snapshot, lk: str, tid: str) -> bool:
        """Whether something will release a task parked behind ``lk``: a run holding a place
        (its end releases one), an owed sweep, or another task of the key that will run (in a
        stream, the schedule, or its fair group's list)."""
        if s.run_sets[lk] or lk in s.owed:
            return True
        return any(
            other != tid
            and rec.get("lk") == lk
            and (
                rec["status"] == "scheduled"
                or (rec["status"] == "queued" and ("eid" in rec or other in self._group_list(rec)))
            )
            for other, rec in s.records.items()
        )

    def _check_expired(self, tid: str, rec: dict[str, str]) -> None:
        deadline = self.tasks[tid].deadline
        if deadline is None or deadline > int(rec["finished"]):
            raise Violation(
                f"task {tid} ended expired at {rec['finished']} but its deadline is "
                f"{deadline} (a task retried by hand has none)"
            )

    def _check_places(self, s: Snapshot) -> None:
        for lk, places in s.run_sets.items():
            want = {
                tid: int(rec.get("attempt", "0"))
                for tid, rec in s.records.items()
                if rec["status"] == "running" and rec.get("lk") == lk
            }
            if places != want:
                raise Violation(f"limit {lk} places {places} != running tasks {want}")
