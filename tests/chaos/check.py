"""The soak's verdict: what ran (journals), what Redis says (records), what the driver did (faults).

Every check is computed from data the faults cannot erase, and each yields figures for the report.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@dataclass
class Fault:
    kind: str  # kill | stop | redis | cut | lostreply | migrate | failover | replica | masterkill
    start: float
    end: float  # when the fault was lifted (kill: the kill itself; lostreply: the reply lost)
    worker: str = ""  # kill, stop: the victim
    detail: str = ""  # lostreply: whose reply (claim, claim+xread, complete)


@dataclass
class WorkerLife:
    wid: str
    pid: int
    started: float
    ended: float | None = None
    code: int | None = None
    killed_at: float | None = None


@dataclass
class Run:
    id: str
    attempt: int
    worker: str
    pid: int
    start: float
    end: float | None = None
    end_kind: str = "open"  # finish | cancelled | raised | killed | exited | open
    causes: list[str] = field(default_factory=list)


def read_journals(directory: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in sorted(directory.glob("journal-*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line torn by SIGKILL mid-write (never seen with O_APPEND)
                    continue
    return out


def subtract(a: float, b: float, holes: list[tuple[float, float]]) -> float:
    """Length of [a, b] minus the union of ``holes``."""
    if b <= a:
        return 0.0
    total = b - a
    for s, e in sorted(holes):
        lo, hi = max(a, s), min(b, e)
        if hi > lo:
            total -= hi - lo
    return max(0.0, total)


def frozen_spans(faults: list[Fault]) -> dict[str, list[tuple[float, float]]]:
    """Each worker's SIGSTOP spans: a stopped process executes nothing."""
    frozen: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in faults:
        if f.kind == "stop":
            frozen[f.worker].append((f.start, f.end))
    return frozen


def build_runs(journal: list[dict[str, Any]], workers: list[WorkerLife]) -> dict[str, list[Run]]:
    """Every run the journals show, by task, in (attempt, start) order. A run without a
    journaled end ends when its worker was killed or exited (open while the worker lives)."""
    lives = {w.wid: w for w in workers}
    starts, ends = _starts_ends(journal)
    runs_by_task: dict[str, list[Run]] = defaultdict(list)
    for (tid, attempt), evs in starts.items():
        for s in evs:
            run = Run(tid, attempt, s["worker"], s["pid"], s["t"])
            end = ends.get((tid, attempt, s["pid"]))
            life = lives.get(s["worker"])
            if end is not None:
                run.end, run.end_kind = end["t"], end["ev"]
            elif life is not None and life.ended is not None:
                run.end = life.killed_at or life.ended
                run.end_kind = "killed" if life.killed_at else "exited"
            runs_by_task[tid].append(run)
    for runs in runs_by_task.values():
        runs.sort(key=lambda r: (r.attempt, r.start))
    return runs_by_task


def _starts_ends(
    journal: list[dict[str, Any]],
) -> tuple[dict[tuple[str, int], list[dict[str, Any]]], dict[tuple[str, int, int], dict[str, Any]]]:
    starts: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    ends: dict[tuple[str, int, int], dict[str, Any]] = {}
    for e in journal:
        if e["ev"] == "start":
            starts[(e["id"], e["attempt"])].append(e)
        elif (e["id"], e["attempt"], e["pid"]) not in ends:
            ends[(e["id"], e["attempt"], e["pid"])] = e
    return starts, ends


def analyze(
    *,
    ids: dict[int, str],
    records: dict[str, dict[str, str]],
    journal: list[dict[str, Any]],
    faults: list[Fault],
    workers: list[WorkerLife],
    heartbeat_s: float,
    visibility_s: float,
    slack_s: float,
    stats: dict[str, int],
    claims_lost_logged: int,
    stale_rejected_logged: int,
    adopted_logged: int = 0,
) -> dict[str, Any]:
    lives = {w.wid: w for w in workers}
    frozen = frozen_spans(faults)
    runs_by_task = build_runs(journal, workers)
    starts, _ = _starts_ends(journal)
    duplicate_starts = sum(len(v) - 1 for v in starts.values() if len(v) > 1)

    # --- 1. every task terminal, none lost ---------------------------------------------------
    status_count: dict[str, int] = defaultdict(int)
    lost = []
    for idx, tid in ids.items():
        st = records.get(tid, {}).get("status", "missing")
        status_count[st] += 1
        if st not in TERMINAL:
            lost.append((idx, tid, st))

    # --- 3. overlaps ------------------------------------------------------------------------
    overlaps, bad_overlaps, latencies = 0, [], []
    for tid, runs in runs_by_task.items():
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                a_end = a.end if a.end is not None else float("inf")
                if a_end <= b.start:
                    continue
                overlaps += 1
                # Time the earlier run really executed alongside the later one: its frozen
                # time does not count (a stopped process runs nothing).
                live = subtract(b.start, a_end, frozen.get(a.worker, []))
                latencies.append(live)
                if live > heartbeat_s + slack_s or a.end_kind not in (
                    "cancelled",
                    "finish",
                    "raised",
                ):
                    bad_overlaps.append(
                        {"task": tid, "earlier": asdict(a), "later": asdict(b), "live_s": live}
                    )

    # --- 4. stored result is the last attempt's ----------------------------------------------
    wrong_results = []
    for idx, tid in ids.items():
        rec = records.get(tid, {})
        runs = runs_by_task.get(tid, [])
        if rec.get("status") != "succeeded":
            continue
        last = max(runs, key=lambda r: r.attempt) if runs else None
        try:
            res = json.loads(rec.get("result", "null"))
        except ValueError:
            res = None
        ok = (
            last is not None
            and isinstance(res, dict)
            and res.get("idx") == idx
            and res.get("attempt") == last.attempt == int(rec.get("attempt", -1))
            and res.get("worker") == last.worker
            and last.end_kind == "finish"
        )
        if not ok:
            wrong_results.append(
                {"idx": idx, "task": tid, "record": rec, "last": last and asdict(last)}
            )

    # --- 5. re-executions == runs interrupted by a fault --------------------------------------
    reexec = sum(len(r) - 1 for r in runs_by_task.values() if r)
    interrupted, unexplained = 0, []
    cause_count: dict[str, int] = defaultdict(int)
    for runs in runs_by_task.values():
        for run in runs[:-1]:
            interrupted += 1
            lo = run.start - 0.2
            hi = (run.end if run.end is not None else run.start) + visibility_s + 1.0
            if run.end_kind == "raised":  # a failure the soak planned (tests/chaos/app.py)
                cause_count["raised"] += 1
                continue
            # One cause per run: a kill or stop of its own worker if any, else the outage
            # (Redis restart or cut) that began nearest to the run's end.
            mine, shared = [], []
            for n, f in enumerate(faults):
                if f.end < lo or f.start > hi:
                    continue
                if f.kind in ("kill", "stop"):
                    if f.worker == run.worker:
                        mine.append((n, f))
                else:
                    shared.append((n, f))
            pick = mine or sorted(shared, key=lambda nf: abs(nf[1].start - (hi - visibility_s)))
            if pick:
                n, f = pick[0]
                run.causes.append(f"{f.kind}#{n}")
            if not run.causes:
                life = lives.get(run.worker)
                if life is not None and life.code not in (None, 0) and not life.killed_at:
                    run.causes.append(f"exit {life.code}")
            if run.causes:
                for c in sorted({c.split("#")[0] for c in run.causes}):
                    cause_count[c] += 1
            else:
                unexplained.append(asdict(run))

    # --- 6. recovery after each fault ----------------------------------------------------------
    finishes = sorted(e["t"] for e in journal if e["ev"] == "finish")
    recovery = []
    for n, f in enumerate(faults):
        k = bisect.bisect_right(finishes, f.end)
        first = finishes[k] - f.end if k < len(finishes) else None
        # The interrupted runs' own recovery: when their tasks next started.
        hit = [
            r for runs in runs_by_task.values() for r in runs[:-1] if f"{f.kind}#{n}" in r.causes
        ]
        restarts = []
        for r in hit:
            nxt = [x.start for x in runs_by_task[r.id] if x.attempt > r.attempt]
            if nxt and min(nxt) >= f.start:
                restarts.append(min(nxt) - f.start)
        recovery.append(
            {
                "kind": f"{f.kind} ({f.detail})" if f.detail else f.kind,
                "worker": f.worker,
                "at": round(f.start, 3),
                "lasted_s": round(f.end - f.start, 3),
                "first_finish_after_s": None if first is None else round(first, 3),
                "interrupted_runs": len(hit),
                "rerun_after_start_s_median": _median(restarts),
                "rerun_after_start_s_max": round(max(restarts), 3) if restarts else None,
            }
        )

    codes: dict[str, int] = defaultdict(int)
    for w in workers:
        codes["killed" if w.killed_at else str(w.code)] += 1
    unexpected_exits = [asdict(w) for w in workers if not w.killed_at and w.code not in (0, 1)]

    checks = [
        ("every task terminal, none lost", not lost, f"{len(lost)} not terminal"),
        ("no (task, attempt) started twice", duplicate_starts == 0, f"{duplicate_starts} twice"),
        (
            "no overlap except a lost claim cancelled within one heartbeat",
            not bad_overlaps,
            f"{overlaps} overlaps, {len(bad_overlaps)} beyond {heartbeat_s}+{slack_s}s",
        ),
        (
            "no stale outcome accepted; result is the last attempt's",
            not wrong_results,
            f"{len(wrong_results)} wrong",
        ),
        (
            "re-executions == runs interrupted by a fault",
            reexec == interrupted and not unexplained,
            f"{reexec} re-executions, {interrupted} interrupted, {len(unexplained)} unexplained",
        ),
        ("workers exit only with 0 or 1 unless killed", not unexpected_exits, f"{dict(codes)}"),
    ]
    return {
        "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks],
        "ok": all(ok for _, ok, _ in checks),
        "figures": {
            "tasks": len(ids),
            "status": dict(status_count),
            "runs": sum(len(r) for r in runs_by_task.values()),
            "reexecutions": reexec,
            "interrupted_runs": interrupted,
            "interrupted_by": dict(cause_count),
            "duplicate_starts": duplicate_starts,
            "overlaps": overlaps,
            "overlap_live_s_max": round(max(latencies), 3) if latencies else 0.0,
            "claims_lost_logged": claims_lost_logged,
            "fence_rejections": stats.get("stale_writes", 0),
            "stale_rejected_logged": stale_rejected_logged,
            "duplicates_absorbed": stats.get("absorbed", 0),
            "runs_adopted_after_lost_reply_logged": adopted_logged,
            "faults": dict(_count_kinds(faults)),
            "worker_exits": dict(codes),
            "recovery_first_finish_s_max": _max(r["first_finish_after_s"] for r in recovery),
            "recovery_first_finish_s_median": _median(r["first_finish_after_s"] for r in recovery),
            "rerun_after_fault_start_s_median": _median(
                r["rerun_after_start_s_median"] for r in recovery
            ),
            "rerun_after_fault_start_s_max": _max(r["rerun_after_start_s_max"] for r in recovery),
        },
        "recovery": recovery,
        "problems": {
            "lost": lost[:20],
            "bad_overlaps": bad_overlaps[:20],
            "wrong_results": wrong_results[:20],
            "unexplained": unexplained[:20],
            "unexpected_exits": unexpected_exits[:20],
        },
    }


def _count_kinds(faults: list[Fault]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for f in faults:
        out[f.kind] += 1
    return out


def _max(xs: Any) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _median(xs: Any) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def markdown(report: dict[str, Any]) -> str:
    fig = report["figures"]
    cfg = report["config"]
    where = (
        "Redis Cluster (3 masters + 3 replicas)"
        if cfg.get("cluster")
        else "Redis with AOF (fsync always)"
    )
    lines = [
        "# dtq chaos soak",
        "",
        f"seed {cfg['seed']}, {cfg['seconds']:.0f} s of faults, {cfg['workers']} workers x "
        f"{cfg['concurrency']} slots, heartbeat {cfg['heartbeat_s']} s, visibility "
        f"{cfg['visibility_s']} s, {where}; wall time "
        f"{report['wall_s']:.0f} s. Verdict: **{'PASS' if report['ok'] else 'FAIL'}**.",
        "",
        "| check | result | figures |",
        "|---|---|---|",
    ]
    for c in report["checks"]:
        lines.append(f"| {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {c['detail']} |")
    lines += ["", "## Figures", "", "| figure | value |", "|---|---|"]
    for k, v in fig.items():
        lines.append(f"| {k} | {v} |")
    lines += [
        "",
        "## Faults and recovery",
        "",
        "`first finish` = first task finished after the fault was lifted; `rerun` = when the "
        "runs the fault interrupted were started again (seconds after the fault began; a rerun "
        "waits behind the backlog of its priority band).",
        "",
        "| # | fault | victim | lasted s | first finish s | interrupted runs | rerun s median "
        "| rerun s max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(report["recovery"], 1):
        lines.append(
            f"| {i} | {r['kind']} | {r['worker'] or 'all'} | {r['lasted_s']} | "
            f"{r['first_finish_after_s']} | {r['interrupted_runs']} | "
            f"{r['rerun_after_start_s_median']} | {r['rerun_after_start_s_max']} |"
        )
    if not report["ok"]:
        lines += ["", "## Problems", "", "```", json.dumps(report["problems"], indent=1)[:20000]]
        lines.append("```")
    return "\n".join(lines) + "\n"


def check_chords(
    chords: list[dict[str, Any]],
    records: dict[str, dict[str, str]],
    journal: list[dict[str, Any]],
) -> dict[str, Any]:
    """The joins of the soak's chords (docs/workflows.md), on top of the per-task checks that
    their members and callbacks pass like any task: every chord's flow succeeded with its
    callback's result; the callback got every member's result, in member order; it started
    exactly once per attempt (and at least once); no attempt of it started before the last
    member's stored run (the attempt its record names) finished. A stale run of a member (a
    frozen one fenced out) may well finish after the callback started: it does not count."""
    starts: dict[str, Counter[int]] = defaultdict(Counter)
    first_start: dict[str, float] = {}
    finish: dict[tuple[str, int], float] = {}
    for e in journal:
        if e["ev"] == "start":
            starts[e["id"]][e["attempt"]] += 1
            first_start[e["id"]] = min(first_start.get(e["id"], e["t"]), e["t"])
        elif e["ev"] == "finish":
            finish[(e["id"], e["attempt"])] = e["t"]
    not_succeeded, wrong_members, bad_starts, early = [], [], [], []
    cb_attempts = 0
    for c in chords:
        flow = records.get(c["flow"], {})
        cb = records.get(c["callback"], {})
        try:
            res = json.loads(cb.get("result", "null"))
            flow_res = json.loads(flow.get("result", "null"))
        except ValueError:
            res = flow_res = None
        if flow.get("status") != "succeeded" or flow_res != res:
            not_succeeded.append({"flow": c["flow"], "status": flow.get("status")})
        if not isinstance(res, dict) or res.get("members") != c["members"]:
            wrong_members.append({"flow": c["flow"], "got": res and res.get("members")})
        per_attempt = starts.get(c["callback"], Counter())
        cb_attempts += len(per_attempt)
        if not per_attempt or max(per_attempt.values()) != 1:
            bad_starts.append({"flow": c["flow"], "starts": dict(per_attempt)})
        stored = [(m, int(records.get(m, {}).get("attempt", -1))) for m in c["member_ids"]]
        done = [finish[k] for k in stored if k in finish]
        if c["callback"] in first_start and done and first_start[c["callback"]] < max(done):
            early.append({"flow": c["flow"], "callback_start": first_start[c["callback"]],
                          "last_member_finish": max(done)})  # fmt: skip
    n = len(chords)
    checks = [
        ("chords: every flow succeeded with its callback's result", not not_succeeded,
         f"{n - len(not_succeeded)} of {n}"),
        ("chords: callback got every member's result, in member order", not wrong_members,
         f"{len(wrong_members)} wrong"),
        ("chords: callback started exactly once per attempt", not bad_starts,
         f"{cb_attempts} callback attempts for {n} chords, {len(bad_starts)} bad"),
        ("chords: no callback started before its last member finished", not early,
         f"{len(early)} early"),
    ]  # fmt: skip
    return {
        "checks": [{"name": name, "ok": ok, "detail": d} for name, ok, d in checks],
        "figures": {"chords": n, "chord_callback_attempts": cb_attempts},
        "problems": {
            "not_succeeded": not_succeeded[:20],
            "wrong_members": wrong_members[:20],
            "bad_starts": bad_starts[:20],
            "early": early[:20],
        },
    }
