"""Fair groups in the chaos soak (docs/faults.md, "Groups in the soak"): which group each task
gets, the driver that holds (pauses) and releases groups during the fault window, the scan for
group keys left behind, and the checks.

A share of the tasks (``--group-share``) gets one of ``--groups`` groups; the first
``--heavy-groups`` of them take half of the grouped tasks between them (a tenant's backlog), the
others share the rest; some grouped tasks are delayed, fail once or always, are cancelled or
expire (GroupPlan). The workers may cap each group's running tasks (``--group-cap``:
DTQ_GROUP_CONCURRENCY=default=N). The checks, on top of the per-task ones that grouped tasks
pass like every task:

- every task ended as planned: succeeded, unless its fate (GroupPlan) lets it end failed,
  cancelled or expired;
- no group key is left once every task ended (``<base>:g:*``: a turn, a waiting list, a
  running set, the active index or the held set; an idle group leaves no key);
- every task's record names the group it was enqueued with (none: no group or '');
- with a cap, no more than N runs of one named group executed at once, except a run whose
  claim was lost (reclaimed while its worker was frozen or cut off) for at most one heartbeat
  plus the slack of executing after the cap's newer run started, as the per-task overlap check
  allows. A run counts until its task's record finished at the latest: one may execute on
  after its place was released with its task's end (a sync task's thread after a cancel,
  docs/lifecycle.md; a frozen worker's run its reclaim failed);
- no run of a held group started while it was held, except one claimed before the hold: its
  start journaled within the slack of the hold, or on a worker frozen across the hold's start.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

import redis

from dtq import Client
from dtq.store.keys import QueueKeys, glob_escape
from tests.chaos.check import TERMINAL, Run, subtract

HEAVY_SHARE = 0.5  # of the grouped tasks, spread over the heavy groups


@dataclass
class Hold:
    group: str
    start: float  # the pause returned (the group was held from then at the latest)
    end: float  # the resume was sent (held until then at least)


def group_names(n: int) -> list[str]:
    return [f"g{i:02d}" for i in range(n)]


def pick_group(rng: random.Random, share: float, names: list[str], heavy: int) -> str | None:
    """The group of one task (None: none), two draws of ``rng`` always."""
    grouped, which = rng.random() < share, rng.random()
    if not grouped or not names:
        return None
    heavy = min(heavy, len(names))
    if heavy and (which < HEAVY_SHARE or heavy == len(names)):
        return names[int(which / HEAVY_SHARE * heavy) % heavy]
    light = names[heavy:]
    return light[int((which - HEAVY_SHARE) / (1 - HEAVY_SHARE) * len(light)) % len(light)]


class GroupPlan:
    """The groups of the soak's tasks, and what some grouped tasks do on top (their fate):
    5 % wait for a delay of 0.5-3 s first (they join their group when due), 4 % raise in their
    first attempt (a retry), 1 % in every attempt with max_retries 1 (the DLQ), 2 % are
    cancelled 0-1 s after the enqueue, 2 % expire 0.2-3 s after it (behind a held or capped
    group some do). Chord steps get a group only. Drawn from an rng of their own: without
    groups a seed's workload and fault sequence stay what they were."""

    def __init__(self, share: float, groups: int, heavy: int, seed: int) -> None:
        self.share, self.heavy = share, heavy
        self.names = group_names(groups)
        self.rng = random.Random(seed * 104729 + 1)
        self.group_of: dict[int, str] = {}  # idx -> its group (grouped tasks only)
        self.fate: dict[int, str] = {}  # idx -> delay | fail_once | fail_always | cancel | expire
        self.cancel_after: dict[int, float] = {}  # idx -> seconds after its enqueue

    def options(self, idx: int, fates: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        """Task idx's enqueue options and the kwargs its task gets on top; none without a
        group share."""
        if self.share <= 0:
            return {}, {}
        g = pick_group(self.rng, self.share, self.names, self.heavy)
        roll, x = self.rng.random(), self.rng.random()
        if g is None:
            return {}, {}
        self.group_of[idx] = g
        opts: dict[str, Any] = {"group": g}
        if not fates or roll >= 0.14:
            return opts, {}
        fate, kw = FATES[sum(roll >= edge for edge in FATE_EDGES)], {}
        self.fate[idx] = fate
        if fate == "delay":
            opts["delay"] = 0.5 + 2.5 * x
        elif fate == "fail_once":
            kw["fail"] = "once"
        elif fate == "fail_always":
            kw["fail"] = "always"
            opts["max_retries"] = 1
        elif fate == "cancel":
            self.cancel_after[idx] = 1.0 * x
        else:
            opts["expires"] = 0.2 + 2.8 * x
        return opts, kw

    def expected(self, idx: int) -> tuple[str, ...]:
        """The statuses task idx may end in."""
        return {
            "fail_always": ("failed",),
            "cancel": ("cancelled", "succeeded"),
            "expire": ("expired", "succeeded"),
        }.get(self.fate.get(idx, ""), ("succeeded",))


FATES = ("delay", "fail_once", "fail_always", "cancel", "expire")
FATE_EDGES = (0.05, 0.09, 0.10, 0.12)  # roll below 0.05: delay, ... below 0.14: expire


class Canceller(threading.Thread):
    """Cancels tasks when they are due (:meth:`add`), retrying while Redis restarts; ends
    once :attr:`done` is set and nothing is left."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.due: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.sent = 0

    def add(self, at: float, task_id: str) -> None:
        with self.lock:
            heapq.heappush(self.due, (at, task_id))

    def run(self) -> None:
        while True:
            with self.lock:
                now = time.time()
                ready = self.due and self.due[0][0] <= now
                item = heapq.heappop(self.due) if ready else None
                idle = not self.due
            if item is None:
                if idle and self.done.is_set():
                    return
                time.sleep(0.05)
                continue
            while True:
                try:
                    self.client.cancel(item[1])
                    self.sent += 1
                    break
                except Exception:  # Redis restarting: the same cancel again
                    time.sleep(0.2)


def drive_holds(
    client: Client, queue: str, names: list[str], rng: random.Random, until: float
) -> list[Hold]:
    """Until ``until``: every 1-3 s, hold a random group for 0.5-3 s, then release it. Each
    call is retried until Redis answers (a restart in progress); the last release is sent
    before ``until``, so nothing stays held into the settle."""
    holds: list[Hold] = []

    def call(fn: Any) -> None:
        while True:
            try:
                fn(queue, group)
                return
            except Exception:  # Redis restarting, a failover: the same (idempotent) call again
                time.sleep(0.2)

    while time.time() < until - 4.0:
        time.sleep(rng.uniform(1.0, 3.0))
        group = rng.choice(names)
        call(client.pause_group)
        start = time.time()
        time.sleep(rng.uniform(0.5, 3.0))
        end = time.time()
        call(client.resume_group)
        holds.append(Hold(group, start, end))
    return holds


class HoldDriver(threading.Thread):
    def __init__(self, client: Client, queue: str, names: list[str], seed: int, until: float):
        super().__init__(daemon=True)
        self.args = (client, queue, names, random.Random(seed), until)
        self.holds: list[Hold] = []

    def run(self) -> None:
        self.holds = drive_holds(*self.args)


def leftover_group_keys(r: Any, qk: QueueKeys) -> dict[str, Any]:
    """Every key under the queue's group prefix, with its type and (a little of) its content."""
    out: dict[str, Any] = {}
    for key in r.scan_iter(match=glob_escape(qk.group_base) + "*", count=1000):
        try:
            kind, content = r.type(key), None
            if kind == "list":
                content = r.lrange(key, 0, 9)
            elif kind == "hash":
                content = r.hgetall(key)
            elif kind == "zset":
                content = r.zrange(key, 0, 9, withscores=True)
            elif kind == "set":
                content = sorted(r.smembers(key))
        except redis.RedisError as e:
            kind, content = "?", str(e)
        out[key] = {"type": kind, "content": content}
    return out


def _stale(runs: list[Run]) -> set[int]:
    """ids of the runs whose claim was lost: not the task's last run, and they executed to
    the end (finished or cancelled) rather than being killed with their worker; a run that
    raised a planned failure only when its task's next run started before it ended."""
    out = set()
    for r, nxt in itertools.pairwise(runs):
        if r.end_kind in ("cancelled", "finish") or (
            r.end_kind == "raised" and r.end is not None and nxt.start < r.end
        ):
            out.add(id(r))
    return out


def cap_excess(
    runs_by_group: dict[str, list[Run]],
    stale: set[int],
    cap: int,
    frozen: dict[str, list[tuple[float, float]]],
    allow_s: float,
) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    """Per group, the most runs that executed at once; the moments more than ``cap`` did that
    stale runs ending within ``allow_s`` of live time do not explain; and how many moments
    they did explain."""
    peak: dict[str, int] = {}
    bad: list[dict[str, Any]] = []
    excused = 0
    for g, runs in runs_by_group.items():
        events = sorted(
            [(r.start, 1, n) for n, r in enumerate(runs)]
            + [(r.end if r.end is not None else float("inf"), 0, n) for n, r in enumerate(runs)]
        )  # an end before a start at the same instant
        live: set[int] = set()
        top = 0
        for t, kind, n in events:
            if kind == 0:
                live.discard(n)
                continue
            live.add(n)
            top = max(top, len(live))
            if cap <= 0 or len(live) <= cap:
                continue
            ok = [
                m
                for m in live
                if m != n
                and id(runs[m]) in stale
                and subtract(t, runs[m].end or float("inf"), frozen.get(runs[m].worker, []))
                <= allow_s
            ]
            if len(live) - cap <= len(ok):
                excused += 1
            else:
                bad.append({"group": g, "at": t, "running": [runs[m].id for m in sorted(live)]})
        peak[g] = top
    return peak, bad, excused


def starts_while_held(
    runs_by_group: dict[str, list[Run]],
    holds: list[Hold],
    frozen: dict[str, list[tuple[float, float]]],
    slack_s: float,
) -> tuple[list[dict[str, Any]], int]:
    """Runs of a held group that started while it was held (beyond the excuses of the
    module's docstring), and the number of excused ones."""
    bad: list[dict[str, Any]] = []
    excused = 0
    for h in holds:
        for r in runs_by_group.get(h.group, []):
            if not h.start < r.start < h.end:
                continue
            froze = any(s <= h.start and e >= h.start for s, e in frozen.get(r.worker, []))
            if r.start <= h.start + slack_s or froze:
                excused += 1
            else:
                bad.append({"group": h.group, "held": [h.start, h.end], "task": r.id,
                            "attempt": r.attempt, "start": r.start})  # fmt: skip
    return bad, excused


def check_groups(
    *,
    ids: dict[int, str],
    plan: GroupPlan,
    heavy: list[str],
    records: dict[str, dict[str, str]],
    runs_by_task: dict[str, list[Run]],
    frozen: dict[str, list[tuple[float, float]]],
    holds: list[Hold],
    leftover: dict[str, Any],
    cap: int,
    heartbeat_s: float,
    slack_s: float,
) -> dict[str, Any]:
    by_group: dict[str, list[Run]] = defaultdict(list)
    stale: set[int] = set()
    wrong_group: list[dict[str, Any]] = []
    unplanned: list[dict[str, Any]] = []
    ran_on = 0
    waits: dict[str, list[float]] = defaultdict(list)
    for idx, tid in ids.items():
        g = plan.group_of.get(idx)
        rec = records.get(tid, {})
        if rec.get("status") not in plan.expected(idx):
            unplanned.append({"idx": idx, "task": tid, "fate": plan.fate.get(idx),
                              "status": rec.get("status")})  # fmt: skip
        if rec.get("grp", "") != (g or ""):
            wrong_group.append({"idx": idx, "task": tid, "want": g, "grp": rec.get("grp")})
        runs = runs_by_task.get(tid, [])
        stale |= _stale(runs)
        if rec.get("status") in TERMINAL and rec.get("finished", "").isdigit():
            # No run holds a place past its task's end; one may execute on (a sync task's
            # thread, cancelled or reclaimed): it counts until then.
            done = int(rec["finished"]) / 1000
            cut = [replace(r, end=done) if r.end is None or r.end > done else r for r in runs]
            ran_on += sum(1 for r in runs if r.end is not None and r.end > done + 0.01)
            stale |= {id(b) for a, b in zip(runs, cut, strict=True) if id(a) in stale}
            runs = cut
        if g is not None:
            by_group[g].extend(runs)
        if runs and "enq" in rec and idx not in plan.fate:
            kind = "ungrouped" if g is None else "heavy" if g in heavy else "light"
            waits[kind].append(runs[0].start - int(rec["enq"]) / 1000)
    peak, over, excused = cap_excess(by_group, stale, cap, frozen, heartbeat_s + slack_s)
    early, held_excused = starts_while_held(by_group, holds, frozen, slack_s)
    fates = Counter(plan.fate.values())
    checks = [
        ("groups: no group key left once every task ended", not leftover,
         f"{len(leftover)} keys left"),
        ("groups: every record names its task's group", not wrong_group,
         f"{len(wrong_group)} wrong"),
        ("groups: every task ended as planned (cancelled, expired, failed only if so planned)",
         not unplanned, f"{len(unplanned)} not; fates {dict(fates)}"),
        (f"groups: at most {cap or 'any'} runs of a group at once (a lost claim: one heartbeat)",
         not over, f"peak {max(peak.values(), default=0)}, {len(over)} over the cap, "
         f"{excused} moments over it by a lost claim's run"),
        ("groups: no run of a held group started while it was held", not early,
         f"{len(holds)} holds, {len(early)} starts inside, {held_excused} excused"),
    ]  # fmt: skip
    return {
        "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks],
        "figures": {
            "grouped_tasks": len(plan.group_of),
            "groups_used": len(set(plan.group_of.values())),
            "group_fates": dict(fates),
            "group_cap": cap,
            "group_peak_running": max(peak.values(), default=0),
            "group_runs_past_their_task_end": ran_on,
            "group_holds": len(holds),
            "first_start_wait_s_p50_p99": {k: _p50_p99(v) for k, v in sorted(waits.items())},
        },
        "problems": {
            "leftover_group_keys": dict(list(leftover.items())[:20]),
            "wrong_group": wrong_group[:20],
            "unplanned": unplanned[:20],
            "over_cap": over[:20],
            "started_while_held": early[:20],
        },
    }


def _p50_p99(xs: list[float]) -> list[float]:
    if not xs:
        return []
    xs = sorted(xs)
    return [round(statistics.median(xs), 3), round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3)]
