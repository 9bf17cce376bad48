"""Worker loops built from their collaborators alone (no Worker, no Redis): each is given a
WorkerEnv and fakes of what it calls, as worker.py (the composition root) gives the real ones."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dtq import App
from dtq import scripts as sc
from dtq.store.keys import Keys
from dtq_worker.env import WorkerEnv
from dtq_worker.executor import Executor
from dtq_worker.heartbeat import Heartbeat
from dtq_worker.metrics import WorkerMetrics
from dtq_worker.outcomes import Outcome, OutcomeWriter
from dtq_worker.runs import Runs
from dtq_worker.slots import Run, Slots, StopReason
from tests.conftest import make_settings


def env_for(app: App) -> WorkerEnv:
    s = app.settings
    return WorkerEnv(s, Keys(s.key_prefix), None, None, None, WorkerMetrics(s.worker_id))  # type: ignore[arg-type]


def make_app() -> App:
    app = App(make_settings("redis://127.0.0.1:1/0", "alone", worker_concurrency=2))

    @app.task(name="ok")
    async def ok() -> int:
        return 7

    @app.task(name="boom")
    def boom() -> None:
        raise ValueError("no")

    return app


def claimed(name: str, tid: str) -> sc.Claimed:
    return sc.Claimed("default", tid, "1-0", 1, name, "[]", "", 3, None, 0, 0, 0, 5, "")


class Writer:
    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.items: list[Any] = []
        self.held_when_written: list[bool] = []

    async def write(self, outcome: Any, still_owned: Any) -> str:
        self.items.append(outcome.item)
        self.held_when_written.append(self.slots.active > 0)
        return "succeeded" if isinstance(outcome.item, sc.Success) else "scheduled"


async def test_the_executor_alone_maps_outcomes_counts_them_and_frees_the_slot_first() -> None:
    app = make_app()
    started: list[Run] = []
    slots = Slots(2, 0, {}, 60.0, started.append)
    writer = Writer(slots)
    counters: dict[str, int] = {}
    with ThreadPoolExecutor(2) as pool:
        ex = Executor(env_for(app), app, pool, writer, slots, counters)  # type: ignore[arg-type]
        for name, tid in (("ok", "t1"), ("boom", "t2")):
            run = Run(claimed(name, tid))
            assert slots.launch(run)
            await ex.execute(run)
    ok, failed = writer.items
    assert isinstance(ok, sc.Success) and ok.payload == "7"
    assert isinstance(failed, sc.Failure) and failed.error == "ValueError: no"
    assert failed.retry_delay_ms > 0 and "Traceback" in failed.traceback
    assert writer.held_when_written == [False, False]  # the slot was free before each write
    assert counters == {"succeeded": 1, "retried": 1}


async def test_an_outcome_writes_refill_is_taken_inside_the_write() -> None:
    """The runs a write's claim took go to ``take`` (Runs.take) as its reply is parsed, with the
    slot held for them still reserved (take gives it back as it launches them): before the run
    whose outcome carried the claim goes on. Until then the poll loop would find the slot held
    by a claim already answered, and the runs would wait for the writer's record and hooks."""
    env = env_for(make_app())
    env.healthy.set()
    slots = Slots(2, 0, {}, 60.0, lambda run: None)
    order: list[Any] = []

    class Scripts:
        async def run(self, call: sc.Call) -> Any:
            order.append("sent")
            # complete.lua with a claim: stored flag of the one outcome, then claim.lua's reply
            # (now, state, absorbed, expired, n, then 14 fields per run).
            run = ["t2", "2-0", 1, "ok", "[]", "", "3", "", "0", "0", "0", "0", "-", ""]
            return [1, [1000, "ok", 0, 0, 1, *run]]

    env.scripts = Scripts()  # type: ignore[assignment]

    def take(queue: str, batch: sc.ClaimBatch, sent: float, reserved: int) -> None:
        order.append(("take", queue, [c.tid for c in batch.runs], reserved, slots.claiming))

    writer = OutcomeWriter(env, slots, take)
    done = sc.Success.of(claimed("ok", "t1"), "succeeded", "7")
    verdict = await writer.write(Outcome("default", done), lambda: True)
    order.append(("returned", verdict))
    assert order == ["sent", ("take", "default", ["t2"], 1, 1), ("returned", "succeeded")]


def test_a_heartbeat_touch_stops_lost_runs_and_passes_on_cancel_flags() -> None:
    app = make_app()
    env = env_for(app)
    env.emit_event = lambda etype, detail="": None  # type: ignore[method-assign]
    with ThreadPoolExecutor(1) as pool:
        runs = Runs(env, app, pool, {}, {})
    lost, kept = Run(claimed("ok", "t1")), Run(claimed("ok", "t2"))
    for run in (lost, kept):
        runs.slots.launch(run)
    stopped: list[tuple[str, StopReason]] = []
    cancels: list[tuple[str | None, str]] = []
    runs.stop = lambda run, reason, detail="": stopped.append((run.claimed.tid, reason))  # type: ignore[method-assign]
    runs.cancel = lambda q, tid: cancels.append((q, tid))  # type: ignore[method-assign]
    hb = Heartbeat(env, runs, app.tasks, {}, on_beat=lambda: None, self_stop=lambda: None)
    touch = sc.TouchResult(lost=["t1", "gone"], cancel_requested=["t2"])
    hb.apply_touch("default", touch, [lost, kept])
    assert stopped == [("t1", StopReason.CLAIM_LOST)]
    assert cancels == [("default", "t2")]
    assert env.metrics.registry.get_sample_value("dtq_claims_lost_total") == 1
