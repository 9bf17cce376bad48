"""The worker's capacity (dtq_worker.slots) alone: no Redis, no worker, a recorded start."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from dtq import scripts as sc
from dtq_worker.slots import Run, Signal, Slots, StopReason

LEASE_S = 10.0


def make_run(queue: str, tid: str, leased: float | None = None) -> Run:
    run = Run(sc.Claimed(queue, tid, "1-0", 1, "t", "[]", "", 3, None, 0, 0, 0, 5, ""))
    if leased is not None:
        run.leased_mono = leased
    return run


class Recorder:
    def __init__(self) -> None:
        self.started: list[Run] = []

    def __call__(self, run: Run) -> None:
        self.started.append(run)


def make_slots(
    concurrency: int = 2, prefetch: int = 2, caps: dict[str, int] | None = None
) -> tuple[Slots, Recorder]:
    rec = Recorder()
    return Slots(concurrency, prefetch, caps or {}, LEASE_S, rec), rec


def claim(slots: Slots, rec: Recorder, run: Run) -> None:
    """As a claim does: reserve, (reply), give back and launch in one step."""
    q = run.claimed.queue
    slots.reserve(q, 1)
    slots.unreserve(q, 1)
    if slots.launch(run):
        rec(run)


def bodies(slots: Slots) -> int:
    return sum(1 for r in slots.inflight.values() if r.holds_slot and not r.waiting)


def test_bodies_never_exceed_the_concurrency_and_the_counts_stay_exact() -> None:
    """Random claims, body ends and forgets (seeded): at every step at most ``concurrency``
    bodies run, ``active`` counts exactly the runs holding a slot, and a claim is never given
    more than the free places."""
    for seed in range(30):
        rnd = random.Random(seed)
        conc, pre = rnd.randint(1, 4), rnd.randint(0, 4)
        caps = {"b": rnd.randint(1, 3)} if rnd.random() < 0.5 else {}
        slots, rec = make_slots(conc, pre, caps)
        n = 0
        for _ in range(300):
            op = rnd.random()
            if op < 0.45:
                q = rnd.choice("ab")
                if slots.free(q) > 0:
                    n += 1
                    claim(slots, rec, make_run(q, f"t{n}"))
            elif op < 0.75:  # a body ends: its outcome write begins
                running = [r for r in slots.inflight.values() if r.holds_slot and not r.waiting]
                if running:
                    slots.release(rnd.choice(running))
            else:  # its outcome stored, or the run lost / handed back
                held = list(slots.inflight.values())
                if held:
                    slots.forget(rnd.choice(held))
            assert bodies(slots) <= conc
            assert slots.active == sum(1 for r in slots.inflight.values() if r.holds_slot)
            assert slots.active - len(slots.ready) == bodies(slots)
            assert slots.active <= conc + pre
            assert all(r.waiting for r in slots.ready)
            for q, cap in caps.items():
                held_q = sum(
                    1 for r in slots.inflight.values() if r.holds_slot and r.claimed.queue == q
                )
                assert held_q <= cap
            # Every started run was handed to ``start`` once, and none from ``ready``.
            assert len(rec.started) == len({id(r) for r in rec.started})
            assert not any(r.waiting for r in rec.started)


def test_a_queue_cap_counts_waiting_runs_and_claims_in_flight() -> None:
    slots, rec = make_slots(concurrency=1, prefetch=4, caps={"b": 2})
    running, waiting = make_run("b", "t1"), make_run("b", "t2")
    claim(slots, rec, running)
    claim(slots, rec, waiting)
    assert rec.started == [running] and list(slots.ready) == [waiting]
    assert slots.free("b") == 0  # the waiting run counts against the cap
    assert slots.free("a") == 3  # concurrency + prefetch less the two held
    slots.forget(waiting)
    assert slots.free("b") == 1
    slots.reserve("b", 1)  # a claim in flight counts too
    assert slots.free("b") == 0 and slots.free("a") == 3
    slots.unreserve("b", 1)
    assert slots.free("b") == 1


def test_a_run_claimed_ahead_holds_its_place_until_it_is_forgotten() -> None:
    """Redis counted a run claimed ahead against its queue's fleet limit when it handed it out:
    the worker counts it held (no new claim takes its place) until its outcome or hand-back."""
    slots, rec = make_slots(concurrency=1, prefetch=1)
    first, second = make_run("a", "t1"), make_run("a", "t2")
    claim(slots, rec, first)
    claim(slots, rec, second)
    assert slots.unheld == 0
    slots.release(first)  # first's body ended: second takes the slot at once
    assert rec.started == [first, second] and not second.waiting
    assert slots.unheld == 0 + 1  # first still writes its outcome, without a slot
    slots.forget(first)
    slots.forget(second)
    assert slots.unheld == 2 and slots.active == 0 and not slots.inflight


def test_forgetting_a_waiting_run_frees_its_slot_and_it_never_starts() -> None:
    slots, rec = make_slots(concurrency=1, prefetch=1)
    first, second = make_run("a", "t1"), make_run("a", "t2")
    claim(slots, rec, first)
    claim(slots, rec, second)
    assert slots.forget(second)
    assert not second.waiting and not slots.ready and slots.active == 1
    slots.release(first)
    slots.forget(first)
    assert rec.started == [first]
    assert slots.active == 0 and slots.active_per_queue == {"a": 0}
    assert not slots.forget(first)  # twice: nothing


def test_a_run_whose_lease_may_have_lapsed_waits_for_a_renewal() -> None:
    """After a freeze, a run claimed long ago may have been reclaimed: it waits in ``ready``
    even with a slot free, and starts once a heartbeat renewed it (fill)."""
    slots, rec = make_slots(concurrency=2, prefetch=0)
    old = make_run("a", "t1", leased=time.monotonic() - 2 * LEASE_S)
    claim(slots, rec, old)
    assert rec.started == [] and list(slots.ready) == [old]
    slots.fill()
    assert rec.started == []
    old.leased_mono = time.monotonic()  # renewed by a heartbeat
    slots.fill()
    assert rec.started == [old] and not slots.ready


def test_a_cancel_hint_heard_after_the_claim_was_sent_stops_the_run_at_launch() -> None:
    slots, _ = make_slots(concurrency=1, prefetch=0)
    sent = time.monotonic()
    slots.hint("t1", horizon_s=60)
    run = make_run("a", "t1", leased=sent)
    assert slots.launch(run)
    assert run.stop_reason is StopReason.CANCELLED and not slots.cancel_hints
    slots.hint("t2", horizon_s=60)  # heard before this claim was sent: an earlier life's
    later = make_run("a", "t2", leased=time.monotonic() + 1)
    slots.release(run)
    assert slots.launch(later) and later.stop_reason is None


def test_cancel_hints_are_bounded_in_age() -> None:
    slots, _ = make_slots()
    slots.hint("old", horizon_s=0.0)
    time.sleep(0.002)
    slots.hint("new", horizon_s=0.001)
    assert list(slots.cancel_hints) == ["new"]


async def test_a_drain_sees_a_claim_in_flight_and_the_runs_it_brings() -> None:
    """The drain waits while a claim is in flight; its runs are held the moment its slots are
    given back (same step), so the drain never sees the worker idle in between."""
    slots, _ = make_slots(concurrency=2, prefetch=0)
    slots.reserve("a", 2)
    slots.begin_drain()
    woke: list[bool] = []

    async def drain() -> None:
        while slots.busy:
            woke.append(await slots.changed.wait(5))

    task = asyncio.ensure_future(drain())
    await asyncio.sleep(0)
    run = make_run("a", "t1")
    slots.unreserve("a", 2)
    assert slots.launch(run)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done() and woke  # woken, and still waiting: the run is in flight
    slots.release(run)
    slots.forget(run)
    await asyncio.wait_for(task, 5)
    assert not slots.busy


async def test_a_drain_hands_runs_back_instead_of_starting_them() -> None:
    slots, rec = make_slots(concurrency=1, prefetch=1)
    first, second = make_run("a", "t1"), make_run("a", "t2")
    claim(slots, rec, first)
    claim(slots, rec, second)
    slots.begin_drain()
    slots.release(first)  # no start from ``ready`` once draining: second is handed back
    assert rec.started == [first] and slots.take_ready() == [second]


async def test_claims_settled_waits_for_that_queue_only() -> None:
    slots, _ = make_slots()
    slots.reserve("a", 1)
    slots.reserve("b", 1)
    assert await slots.claims_settled("c", timeout=0)
    waiter = asyncio.ensure_future(slots.claims_settled("a"))
    await asyncio.sleep(0)
    slots.unreserve("b", 1)
    await asyncio.sleep(0)
    assert not waiter.done()
    slots.unreserve("a", 1)
    assert await asyncio.wait_for(waiter, 5)
    slots.reserve("a", 1)
    assert not await slots.claims_settled(None, timeout=0.01)


async def test_a_signal_wakes_only_those_waiting_and_times_out() -> None:
    sig = Signal()
    sig.notify()  # nobody waits: lost
    assert not await sig.wait(0.01)
    waiter = asyncio.ensure_future(sig.wait(5))
    await asyncio.sleep(0)
    sig.notify()
    assert await waiter


def test_the_poll_loop_is_woken_only_for_slots_no_claim_took() -> None:
    """Giving back a refill's reservation (its runs take the slots) does not wake the poll
    loop; giving back slots nobody took does (``wake``), as does a forget that frees one."""
    slots, rec = make_slots(concurrency=1, prefetch=0)
    woken: list[int] = []
    slots.changed = _Counting(woken)
    slots.reserve("a", 1)
    slots.unreserve("a", 1)
    assert woken == []
    slots.reserve("a", 1)
    slots.unreserve("a", 1, wake=True)
    assert woken == [1]
    run = make_run("a", "t1")
    claim(slots, rec, run)
    slots.forget(run)
    assert woken == [1, 1]


class _Counting(Signal):
    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.seen = seen

    def notify(self) -> None:
        self.seen.append(1)


@pytest.mark.parametrize("n", [1, 3])
def test_unheld_counts_every_claim_in_flight(n: int) -> None:
    slots, _ = make_slots(concurrency=2, prefetch=2)
    slots.reserve("a", n)
    assert slots.unheld == 4 - n
