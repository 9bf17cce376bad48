"""The poll loop (dtq_worker/consumer.py) alone: a WorkerEnv, real Slots, and fakes of the
scripts, the recovery and the idle-wait lane, no Redis. What it must do: claim up to the free
slots in one call per queue, keep per-queue caps, block (not claim again) when the queues are
empty, hand a lost reply to the recovery, and stop cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from dtq import scripts as sc
from dtq.store.keys import Keys
from dtq_worker.clusterwait import ClusterWait
from dtq_worker.consumer import Consumer
from dtq_worker.env import WorkerEnv
from dtq_worker.metrics import WorkerMetrics
from dtq_worker.slots import Run, Slots
from tests.conftest import make_settings

NOW_MS = 1_700_000_000_000


def claim_reply(queue: str, tids: list[str], *, more: bool = False) -> list[Any]:
    """claim.lua's reply starting ``tids`` (14 fields a run), then held and more."""
    raw: list[Any] = [NOW_MS, "ok", 0, 0, len(tids)]
    for tid in tids:
        raw += [tid, f"{tid}-0", 1, "job", "[]", "", "3", "", "0", "0", NOW_MS, "5", "-", ""]
    return [*raw, 0, 1 if more else 0]


class FakeQueues:
    """The scripts object: each queue a list of task ids; a claim takes up to its count."""

    def __init__(self, keys: Keys, tasks: dict[str, list[str]]) -> None:
        self.keys = keys
        self.tasks = tasks
        self.claims: list[tuple[str, int]] = []  # (queue, count) of every claim sent
        self.claiming_seen: list[int] = []  # Slots.claiming while each claim was out
        self.slots: Slots | None = None
        self.fault: BaseException | None = None

    def queue_of(self, call: sc.Call) -> str:
        return next(q for q in self.tasks if self.keys.queue(q).sched in call.keys)

    def take(self, call: sc.Call) -> list[Any]:
        assert call.script == "claim"
        q, count = self.queue_of(call), int(call.args[2])
        self.claims.append((q, count))
        if self.slots is not None:
            self.claiming_seen.append(self.slots.claiming)
        taken, self.tasks[q] = self.tasks[q][:count], self.tasks[q][count:]
        return claim_reply(q, taken)

    async def run(self, call: sc.Call) -> Any:
        await asyncio.sleep(0)  # a round trip yields to the event loop
        if self.fault is not None:
            raise self.fault
        return self.take(call)

    def evalsha(self, call: sc.Call) -> sc.Call:
        return call  # the idle pair sends it behind the XREAD: FakeLane.call_pair runs it


class FakeLane:
    """The idle wait's kept connection: the XREAD returns when ``wake`` is set."""

    def __init__(self, queues: FakeQueues) -> None:
        self.queues = queues
        self.wake = asyncio.Event()
        self.pairs = 0
        self.waits = 0  # XREADs sent alone (no claim behind them)
        self.on_pair: Callable[[], None] = lambda: None
        self.fault: BaseException | None = None

    async def connection(self) -> object:
        return self

    async def call(self, args: tuple[Any, ...]) -> Any:
        if args[0] == "CLIENT":
            return 7
        self.waits += 1
        await self.wake.wait()
        return None

    async def call_pair(self, xread: tuple[Any, ...], claim: sc.Call, timeout: float) -> Any:
        assert xread[0] == "XREAD"
        self.pairs += 1
        self.on_pair()
        await self.wake.wait()
        if self.fault is not None:
            return None, self.fault
        return None, self.queues.take(claim)


class FakeRecovery:
    def __init__(self) -> None:
        self.requested: list[str] = []
        self.pending: dict[str, asyncio.Event] = {}

    def active(self, queue: str) -> bool:
        return queue in self.pending

    async def wait(self, queue: str) -> None:
        await self.pending[queue].wait()

    def request(self, queue: str) -> None:
        self.requested.append(queue)


class Unblocker:
    def __init__(self, lane: FakeLane) -> None:
        self.lane = lane
        self.unblocked: list[int] = []

    async def client_unblock(self, client_id: int) -> None:
        self.unblocked.append(client_id)
        self.lane.wake.set()


class Setup:
    def __init__(
        self,
        tasks: dict[str, list[str]],
        *,
        concurrency: int = 4,
        caps: dict[str, int] | None = None,
        partitions: dict[str, int] | None = None,
    ) -> None:
        """``tasks``: physical queue -> its task ids (a partitioned queue: every partition)."""
        queues = ",".join(q for q in tasks if "~" not in q)
        s = make_settings(
            "redis://127.0.0.1:1/0", "alone", worker_concurrency=concurrency, queues=queues,
            queue_partitions=partitions or {},
        )  # fmt: skip
        self.scripts = FakeQueues(Keys(s.key_prefix), tasks)
        scripts: Any = self.scripts
        self.env = WorkerEnv(s, Keys(s.key_prefix), None, None, scripts, WorkerMetrics(s.worker_id))
        self.env.healthy.set()
        self.slots = Slots(
            concurrency, 0, caps or {}, 60.0, lambda run: None, self.env.partitions_of
        )
        self.scripts.slots = self.slots
        self.recovery = FakeRecovery()
        self.launched: list[tuple[str, str]] = []
        self.groups_made = 0
        self.more = False  # as Runs.more: a claim stopped at its scan budget
        recovery: Any = self.recovery
        runs: Any = self  # takes every claim's reply, as Runs does
        self.consumer = Consumer(self.env, runs, recovery, self.ensure_groups)
        self.lane = FakeLane(self.scripts)
        self.consumer._wake = self.lane  # type: ignore[assignment]
        self.redis = Unblocker(self.lane)
        self.env.redis = self.redis

    def take(self, queue: str, batch: sc.ClaimBatch, sent: float, reserved: int = 0) -> None:
        """Runs.take: give back the claim's slots and launch its runs in one step."""
        if reserved:
            self.slots.unreserve(queue, reserved)
        self.more = self.more or batch.more
        for c in batch.runs:
            assert self.slots.launch(Run(c))
            self.launched.append((c.queue, c.tid))

    async def ensure_groups(self) -> None:
        self.groups_made += 1

    def errors(self) -> float | None:
        return self.env.metrics.registry.get_sample_value(
            "dtq_worker_redis_errors_total", {"loop": "poll"}
        )


async def settle() -> None:
    """Let every task that can run go on until it waits (no clock involved)."""
    for _ in range(20):
        await asyncio.sleep(0)


def tids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


async def test_a_claim_asks_for_its_free_slots_holds_them_until_its_reply_and_launches_runs() -> (
    None
):
    t = Setup({"default": tids("t", 6)}, concurrency=4)
    assert await t.consumer.claim_once() == (4, NOW_MS, False)  # as many as asked: not drained
    assert t.scripts.claims == [("default", 4)]
    assert t.scripts.claiming_seen == [4]  # held while the claim was out
    assert t.slots.claiming == 0 and t.slots.active == 4
    assert t.launched == [("default", f"t{i}") for i in range(4)]
    # Every slot is held: no claim is sent.
    assert await t.consumer.claim_once() == (0, 0, False)
    assert t.scripts.claims == [("default", 4)]
    # Two slots free again: a claim of two, which finds two of the six and drains the queue.
    for run in list(t.slots.inflight.values())[:2]:
        t.slots.release(run)
        t.slots.forget(run)
    assert await t.consumer.claim_once() == (2, NOW_MS, False)
    assert await t.consumer.claim_once() == (0, 0, False)
    assert t.scripts.claims == [("default", 4), ("default", 2)]


async def test_a_queue_that_gives_fewer_runs_than_free_slots_is_drained() -> None:
    t = Setup({"default": tids("t", 3)}, concurrency=4)
    assert await t.consumer.claim_once() == (3, NOW_MS, True)


async def test_claims_keep_each_queues_cap_and_fill_the_rest_from_the_next_queue() -> None:
    t = Setup({"a": tids("a", 5), "b": tids("b", 5)}, concurrency=4, caps={"a": 1})
    await t.consumer.claim_once()
    assert t.scripts.claims == [("a", 1), ("b", 3)]
    assert sorted(q for q, _ in t.launched) == ["a", "b", "b", "b"]
    # The one "a" run ends: only "a" has a free slot within its cap, and only it is asked.
    run = t.slots.inflight[("a", "a0")]
    t.slots.release(run)
    t.slots.forget(run)
    await t.consumer.claim_once()
    assert t.scripts.claims[2:] == [("a", 1)]
    assert t.slots.active_per_queue == {"a": 1, "b": 3}


async def test_an_empty_queue_is_waited_on_with_the_claim_behind_the_wait_not_claimed_again() -> (
    None
):
    t = Setup({"default": []}, concurrency=2)

    def third_pair() -> None:
        if t.lane.pairs == 1:
            t.lane.wake.set()  # the first wake-up finds nothing either
        elif t.lane.pairs == 3:
            t.scripts.tasks["default"].append("late")  # an enqueue wakes the third wait
        if t.lane.pairs == 4:
            t.env.stop_event.set()

    t.lane.on_pair = third_pair
    t.lane.wake.set()
    await asyncio.wait_for(t.consumer.loop(), 5)
    # One claim on its own, then every claim rode behind a wait: no empty claim in a loop.
    assert t.scripts.claims[0] == ("default", 2)
    assert t.lane.pairs == 4
    assert t.launched == [("default", "late")]
    assert t.slots.claiming == 0


async def test_a_lost_claim_reply_asks_for_recovery_gives_the_slots_back_and_backs_off() -> None:
    t = Setup({"default": tids("t", 3)}, concurrency=2)
    t.scripts.fault = RedisConnectionError("reset by peer")
    with pytest.raises(RedisConnectionError):
        await t.consumer.claim_once()
    assert t.recovery.requested == ["default"]  # it may have run: its runs are found
    assert t.slots.claiming == 0

    # In the loop: counted, backed off (the stop ends the backoff's sleep), then stopped.
    t.recovery.requested.clear()
    real_failed = t.consumer.backoff.failed

    def failed(exc: BaseException) -> float:
        t.env.stop_event.set()
        return real_failed(exc)

    t.consumer.backoff.failed = failed  # type: ignore[method-assign]
    await asyncio.wait_for(t.consumer.loop(), 5)
    assert t.errors() == 1 and t.consumer.backoff.failures == 1
    assert t.recovery.requested == ["default"]
    assert t.launched == []


async def test_a_lost_reply_of_the_idle_pair_asks_for_recovery_and_a_noscript_does_not() -> None:
    t = Setup({"default": []}, concurrency=2)
    t.lane.wake.set()
    t.lane.fault = NoScriptError("NOSCRIPT No matching script")
    # The claim behind the wait did not run: it is sent again the usual way (which loads it).
    assert await t.consumer.claim_once(NOW_MS) == (0, NOW_MS, True)
    assert t.lane.pairs == 1 and t.scripts.claims == [("default", 2)]
    assert t.recovery.requested == [] and t.slots.claiming == 0

    async def lost(*args: Any) -> Any:
        raise RedisConnectionError("reset by peer")

    t.lane.call_pair = lost  # type: ignore[method-assign,assignment]
    # In the loop (its first pass finds the queue empty, the next one waits): the lost reply
    # is counted and backed off (the stop ends the backoff's sleep).
    real_failed = t.consumer.backoff.failed

    def failed(exc: BaseException) -> float:
        t.env.stop_event.set()
        return real_failed(exc)

    t.consumer.backoff.failed = failed  # type: ignore[method-assign]
    await asyncio.wait_for(t.consumer.loop(), 5)
    assert t.recovery.requested == ["default"]
    assert t.slots.claiming == 0 and t.consumer.backoff.failures == 1


async def test_no_claim_of_a_queue_is_sent_while_its_recovery_is_pending() -> None:
    t = Setup({"default": tids("t", 2)}, concurrency=2)
    done = t.recovery.pending["default"] = asyncio.Event()
    claim = asyncio.ensure_future(t.consumer.claim_once())
    await settle()
    assert t.scripts.claims == [] and not claim.done()
    del t.recovery.pending["default"]
    done.set()
    assert await claim == (2, NOW_MS, False)


async def test_a_stop_unblocks_the_idle_wait_and_the_runs_its_claim_took_are_launched() -> None:
    t = Setup({"default": []}, concurrency=2)
    t.lane.wake.set()  # the first wait finds nothing
    waiting = asyncio.Event()

    def on_pair() -> None:
        if t.lane.pairs == 2:
            t.lane.wake.clear()  # the second blocks until unblocked
            t.scripts.tasks["default"].append("t0")
            waiting.set()

    t.lane.on_pair = on_pair
    loop = asyncio.ensure_future(t.consumer.loop())
    await asyncio.wait_for(waiting.wait(), 5)
    await asyncio.sleep(0)
    assert t.env.idle and t.slots.claiming == 2  # the drain sees the claim behind it
    t.env.stop_event.set()
    t.slots.begin_drain()
    t.consumer.interrupt()
    await asyncio.wait_for(loop, 5)
    assert t.redis.unblocked == [7]  # CLIENT UNBLOCK of the lane's connection
    assert t.launched == [("default", "t0")]  # they drain like any other run
    assert t.slots.claiming == 0 and not t.env.idle


async def test_the_loop_claims_nothing_while_every_slot_is_held_or_redis_is_unhealthy() -> None:
    t = Setup({"default": tids("t", 4)}, concurrency=1)
    await t.consumer.claim_once()
    assert t.scripts.claims == [("default", 1)]
    loop = asyncio.ensure_future(t.consumer.loop())
    await settle()
    assert t.scripts.claims == [("default", 1)]  # waits for a slot, sending nothing
    assert t.lane.waits == 0 and t.lane.pairs == 0
    t.env.healthy.clear()
    run = next(iter(t.slots.inflight.values()))
    t.slots.release(run)
    t.slots.forget(run)
    await settle()
    assert t.scripts.claims == [("default", 1)]  # a free slot, but the heartbeat fails
    assert t.lane.waits == 0 and t.lane.pairs == 0
    t.env.stop_event.set()
    await asyncio.wait_for(loop, 5)


def end(t: Setup, queue: str, tid: str) -> None:
    """The run of ``tid`` ends (its outcome stored): its slot is free."""
    run = t.slots.inflight[(queue, tid)]
    t.slots.release(run)
    t.slots.forget(run)


async def until(pred: Callable[[], bool]) -> None:
    for _ in range(200):
        if pred():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


async def test_every_queue_at_its_cap_waits_for_a_slot_not_for_entries() -> None:
    """Slots are free but the only queue is at its cap: nothing can be claimed until a run
    ends. Before, the loop sent an XREAD from id 0 after each empty pass, which Redis answered
    at once (the queue's own backlog): a busy loop of XREADs (8,750 in 3 s in a real worker)."""
    t = Setup({"slow": tids("s", 3)}, concurrency=4, caps={"slow": 1})
    loop = asyncio.ensure_future(t.consumer.loop())
    await until(lambda: len(t.launched) == 1)
    await settle()
    assert t.scripts.claims == [("slow", 1)]
    assert t.lane.waits == 0 and t.lane.pairs == 0  # no read while nothing can be claimed
    end(t, "slow", "s0")
    await until(lambda: len(t.launched) == 2)  # the slot freed is claimed at once
    assert t.scripts.claims == [("slow", 1), ("slow", 1)]
    t.env.stop_event.set()
    t.slots.changed.notify()
    await asyncio.wait_for(loop, 5)


async def test_a_run_ending_below_its_cap_ends_the_idle_wait() -> None:
    """A queue at its cap has a backlog, the other queue is empty: the worker waits for new
    entries, and a run of the capped queue that ends must end that wait too. Before, the next
    capped run started only when the block ran out (6 runs of 0.2 s took 5.4 s, not 1.2)."""
    t = Setup({"slow": tids("s", 3), "fast": []}, concurrency=4, caps={"slow": 1})

    def blocks() -> None:  # every wait blocks until unblocked (no new entry comes)
        t.lane.wake.clear()

    t.lane.on_pair = blocks
    loop = asyncio.ensure_future(t.consumer.loop())
    await until(lambda: t.lane.pairs == 1)  # blocked on new entries, fast's claim behind it
    assert t.launched == [("slow", "s0")]
    end(t, "slow", "s0")
    await until(lambda: len(t.launched) == 2)
    assert t.launched[1] == ("slow", "s1")
    assert t.redis.unblocked == [7]  # the wait was ended (CLIENT UNBLOCK), not waited out
    t.env.stop_event.set()
    t.consumer.interrupt()
    t.lane.wake.set()
    await asyncio.wait_for(loop, 5)


async def test_partition_turns_advance_with_the_claims_sent_only() -> None:
    """Each claim sent starts at the next partition; a pass that sends none (the queue at its
    cap) and the wait that follows do not move the turn. Before, both did: the claim after
    them started three partitions on, and which partitions came next depended on timing."""
    parts = {"bulk": tids("a", 3), "bulk~1": tids("b", 3), "bulk~2": tids("c", 3),
             "bulk~3": tids("d", 3)}  # fmt: skip
    t = Setup(parts, concurrency=2, caps={"bulk": 1}, partitions={"bulk": 4})
    loop = asyncio.ensure_future(t.consumer.loop())
    await until(lambda: len(t.launched) == 1)
    await settle()
    for _ in range(3):
        q, tid = t.launched[-1]
        end(t, q, tid)
        n = len(t.launched)
        await until(lambda n=n: len(t.launched) == n + 1)  # type: ignore[misc]
        await settle()
    starts = [q for q, _ in t.launched]
    assert starts == ["bulk", "bulk~1", "bulk~2", "bulk~3"]
    t.env.stop_event.set()
    t.slots.changed.notify()
    t.consumer.interrupt()
    t.lane.wake.set()
    await asyncio.wait_for(loop, 5)


async def test_the_cluster_wait_ends_when_a_capped_queue_frees_a_slot() -> None:
    """On a cluster the idle wait is one XREAD per queue (clusterwait.py): a freed slot of a
    capped queue ends it too, and the reads still pending are kept for the next wait."""
    t = Setup({"slow": [], "fast": []}, concurrency=2)
    sent: list[str] = []

    class Blocking:
        async def xread(self, streams: dict[str, str], count: int, block: int) -> Any:
            sent.append(next(iter(streams)))
            await asyncio.Event().wait()  # no new entry ever comes

    t.env.blocking = Blocking()  # type: ignore[assignment]
    cw = ClusterWait(t.env, 1000, 30.0)
    freed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wait = asyncio.ensure_future(cw.wait("0-0", freed))
    await settle()
    assert not wait.done() and len(sent) == 2
    freed.set_result(None)
    await asyncio.wait_for(wait, 5)
    # The next wait sends nothing new: both reads still wait for entries.
    again = asyncio.ensure_future(cw.wait("0-0"))
    await settle()
    assert len(sent) == 2 and not again.done()
    cw.interrupt()
    await asyncio.wait_for(again, 5)


async def test_a_slot_freed_during_a_pass_waits_for_the_next_partitions_turn() -> None:
    """The pass waits for a recovery of one partition (the heartbeat asks for one of every
    queue a few times per visibility timeout) while the run it just claimed ends: the freed slot
    goes to the next pass, which starts at the next partition. Before, the same pass claimed
    again, from the partition after the one recovering, and that partition's turn came twice in
    a row (the CI failure of test_partitions' turn test: starts 1, 3 then 3 again)."""
    parts = {"bulk": tids("a", 3), "bulk~1": tids("b", 3), "bulk~2": tids("c", 3),
             "bulk~3": tids("d", 3)}  # fmt: skip
    t = Setup(parts, concurrency=1, partitions={"bulk": 4})
    recovering = t.recovery.pending["bulk~1"] = asyncio.Event()
    loop = asyncio.ensure_future(t.consumer.loop())
    await until(lambda: len(t.launched) == 1)  # bulk's run; the pass now waits for bulk~1's
    end(t, *t.launched[0])
    del t.recovery.pending["bulk~1"]
    recovering.set()
    for n in range(2, 5):
        await until(lambda n=n: len(t.launched) == n)  # type: ignore[misc]
        await settle()
        end(t, *t.launched[-1])
    assert [q for q, _ in t.launched] == ["bulk", "bulk~1", "bulk~2", "bulk~3"]
    t.env.stop_event.set()
    t.slots.changed.notify()
    t.consumer.interrupt()
    t.lane.wake.set()
    await asyncio.wait_for(loop, 5)
