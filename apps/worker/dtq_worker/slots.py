"""A worker's capacity: which runs it holds, how many bodies run, and what claims may still take.

A run holds a slot from its launch until its body is over; a claim in flight reserves the slots
it asks for until its runs are launched, in the same step. The invariants this keeps (bodies
within the concurrency, claims within the free slots and queue caps, a drain that sees every run
in flight): docs/design.md, "The slots". Also here, as they decide whether a launched run may
start: the cancel hints for runs not (yet) held and the guard that launches a run only once.

Nothing here touches Redis or creates tasks: Runs (runs.py) passes ``start`` (begin a run's task).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dtq.run import Attempt
from dtq.scripts import RunRef
from dtq.store.partitions import logical

log = logging.getLogger("dtq.worker")

# At most this many cancel hints are kept for tasks not held here (Slots.hint).
CANCEL_HINTS_MAX = 4096


class StopReason(Enum):
    CLAIM_LOST = "claim lost"  # reclaimed by another worker: write nothing
    CANCELLED = "cancelled"  # a user asked: write "cancelled"
    SHUTDOWN = "shutdown"  # drain ran out: hand back through requeue.lua


@dataclass(eq=False)
class Run(Attempt):
    """One attempt held here: what the runner reads (dtq.run.Attempt), and its slot and lease."""

    # Its lease is held from no earlier than this (monotonic): when its claim was sent, then
    # when a heartbeat that renewed it was sent (Slots.fill).
    leased_mono: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    stop_reason: StopReason | None = None
    cancel_detail: str = ""
    writing: bool = False  # the outcome write began: a stop no longer cancels the task
    holds_slot: bool = False  # counted in Slots.active: see Slots.release
    answered: bool = False  # the fence answered the outcome write (stored or stale)
    waiting: bool = False  # claimed ahead (prefetch): in Slots.ready, its body not started

    @property
    def key(self) -> tuple[str, str]:
        return (self.claimed.queue, self.claimed.tid)

    @property
    def ref(self) -> RunRef:
        c = self.claimed
        return RunRef(c.tid, c.eid, c.attempt)

    def stop(self, reason: StopReason, detail: str = "") -> None:
        """Stop the run; the first reason wins."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.cancel_detail = detail
        if self.task is not None and not self.task.done() and not self.writing and self.begun:
            self.task.cancel()

    @property
    def begun(self) -> bool:
        """Whether its task's coroutine has begun. A task cancelled before its first step never
        runs its coroutine, cleanup included (Runs._run's release of the slot): a run stopped
        that early is left to start, and Executor.execute ends it by its stop reason."""
        coro: Any = self.task.get_coro() if self.task is not None else None
        return coro is not None and inspect.getcoroutinestate(coro) != inspect.CORO_CREATED


class Signal:
    """Wakes every waiter of the moment it is notified (no memory: a notify with nobody waiting
    is lost, so a waiter checks its condition before it waits)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for f in waiters:
                if not f.done():
                    f.set_result(None)

    async def wait(self, timeout: float | None = None) -> bool:
        """Until the next notify (True) or ``timeout`` seconds (False)."""
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(f)
        try:
            if timeout is None:
                await f
                return True
            async with asyncio.timeout(timeout):
                await f
            return True
        except TimeoutError:
            return False
        finally:
            if not f.done():
                f.cancel()
                if f in self._waiters:
                    self._waiters.remove(f)


class Slots:
    def __init__(
        self,
        concurrency: int,
        prefetch: int,
        queue_caps: dict[str, int],
        lease_s: float,
        start: Callable[[Run], None],
        partitions_of: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        """``lease_s``: how long after its claim (or its last renewal) a run's lease is surely
        still held (the visibility timeout less one heartbeat interval); ``start``: begins a
        run's task (its body, or the write of its stop); ``partitions_of``: each partition of a
        partitioned queue -> all of them (WorkerEnv.partitions_of): a queue's cap covers all."""
        self.concurrency = concurrency
        self.capacity = concurrency + prefetch
        self.queue_caps = dict(queue_caps)
        self.partitions_of = partitions_of or {}
        self.lease_s = lease_s
        self._start = start
        self.inflight: dict[tuple[str, str], Run] = {}
        self.ready: deque[Run] = deque()
        self.active = 0  # runs holding a slot (running or in ``ready``)
        self.active_per_queue: dict[str, int] = {}
        self.claiming = 0  # slots reserved by claims in flight
        self.claiming_per_queue: dict[str, int] = {}
        # tid -> when heard (monotonic), for tasks not held here; insertion order is age order.
        self.cancel_hints: dict[str, float] = {}
        self.draining = False
        # Queues whose recovery is pending or in flight: no claim of them is sent (recovery.py).
        self.recovering: set[str] = set()
        self.changed = Signal()  # a slot freed; while draining, any change
        self._claims = Signal()  # a claim's reservation was given back

    # --- what may be claimed -----------------------------------------------------------------

    @property
    def unheld(self) -> int:
        """Places for new runs: the concurrency plus the prefetch, less the runs held (running
        or claimed ahead) and the slots reserved for claims in flight (any queue)."""
        return self.capacity - self.active - self.claiming

    def free(self, queue: str) -> int:
        """Slots free for new runs of ``queue`` (worker concurrency and the queue's cap)."""
        free = self.capacity - self.active - self.claiming
        parts = self.partitions_of.get(queue)
        cap = self.queue_caps.get(queue if parts is None else logical(queue))
        if cap is not None:
            taken = 0
            for q in parts or (queue,):
                taken += self.active_per_queue.get(q, 0) + self.claiming_per_queue.get(q, 0)
            free = min(free, cap - taken)
        return free

    def reserve(self, queue: str, n: int) -> None:
        """Hold ``n`` slots for a claim in flight."""
        self.claiming += n
        self.claiming_per_queue[queue] = self.claiming_per_queue.get(queue, 0) + n

    def unreserve(self, queue: str, n: int, wake: bool = False) -> None:
        """Give back ``n`` reserved slots. The claim's runs are launched right after (no await
        in between), so a drain woken here sees them in ``inflight``. ``wake``: the slots are
        really free now (not taken by the claim's runs): wake the poll loop."""
        self.claiming -= n
        self.claiming_per_queue[queue] -= n
        self._claims.notify()
        if wake or self.draining:
            self.changed.notify()

    async def claims_settled(self, queue: str | None, timeout: float | None = None) -> bool:
        """Until no claim (of ``queue``; of any queue when None) is in flight; False when
        ``timeout`` passed first."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while self.claiming_per_queue.get(queue, 0) if queue is not None else self.claiming:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await self._claims.wait(left)
        return True

    # --- runs ----------------------------------------------------------------------------------

    def launch(self, run: Run) -> bool:
        """Hold ``run`` (a new claim of a task not held here). True: start its task now (its
        body has a slot, or it was cancelled before its claim's reply came and only writes
        that); False: it waits in ``ready`` for a slot or a renewed lease."""
        self.inflight[run.key] = run
        q = run.claimed.queue
        self.active += 1
        self.active_per_queue[q] = self.active_per_queue.get(q, 0) + 1
        run.holds_slot = True
        if self.cancel_hints:
            heard = self.cancel_hints.pop(run.claimed.tid, None)
            # Only a hint heard after the claim was sent is this run's (cancel.lua flags a
            # running task: this claim had run); an older one was for an earlier life.
            if heard is not None and heard >= run.leased_mono:
                log.info(
                    "cancel requested before its claim's reply came: %s attempt %d",
                    run.task_id,
                    run.claimed.attempt,
                )
                run.stop(StopReason.CANCELLED, "cancelled by request")
                return True
        if self.active - len(self.ready) <= self.concurrency and self.fresh(run):
            return True  # (also while draining: the drain lets a claim in flight run)
        run.waiting = True
        self.ready.append(run)
        if self.draining:
            self.changed.notify()  # the drain hands it back
        return False

    def fresh(self, run: Run) -> bool:
        """Whether the run's lease is surely still held: its claim was sent, or a heartbeat
        renewed it, less than ``lease_s`` ago."""
        return run.leased_mono >= time.monotonic() - self.lease_s

    def release(self, run: Run) -> None:
        """The run's body is over (its outcome is being written): its slot can be refilled.

        A run claimed ahead takes the slot at once. Does not wake the poll loop: the outcome
        write itself refills the slot (complete.lua claims), and forget wakes the poll loop for
        whatever that left free.
        """
        if run.holds_slot:
            run.holds_slot = False
            self.active -= 1
            self.active_per_queue[run.claimed.queue] -= 1
            if self.ready:
                self.fill()

    def fill(self) -> None:
        """Start runs claimed ahead while fewer bodies than the concurrency run, and only while
        the run's lease is surely still held: after a freeze its entry may have been reclaimed,
        and the next heartbeat says so before it starts here, or renews it and calls this."""
        ready = self.ready
        while ready and not self.draining and self.active - len(ready) < self.concurrency:
            if not self.fresh(ready[0]):
                break
            run = ready.popleft()
            run.waiting = False
            self._start(run)

    def forget(self, run: Run) -> bool:
        """The run is no longer this worker's (its outcome stored, handed back, or lost): drop
        it and give back its slot. False when it was not held (already forgotten, or replaced
        by a newer attempt)."""
        if self.inflight.get(run.key) is not run:
            return False
        del self.inflight[run.key]
        if run.waiting:  # its body never started
            self.ready.remove(run)
            run.waiting = False
        self.release(run)
        # Wakes the poll loop only for a slot no claim holds (a refilled slot went to the
        # outcome write's claim: waking it would only send it back to wait), and the drain.
        if self.draining or self.capacity - self.active - self.claiming > 0:
            self.changed.notify()
        return True

    def start_waiting(self, run: Run) -> None:
        """Start a waiting run's task now, in the slot it holds (a cancelled run: it writes
        "cancelled" without running its body)."""
        self.ready.remove(run)
        run.waiting = False
        self._start(run)

    def take_ready(self) -> list[Run]:
        """Every run waiting for a slot, as they are (still held: forget each when done)."""
        return list(self.ready)

    # --- cancel hints ------------------------------------------------------------------------

    def hint(self, tid: str, horizon_s: float) -> None:
        """Keep a cancel hint for a task not held here: a claim of it may be on its way back
        (launch applies it). Every worker hears every hint; most are for other workers' runs
        and age out: at most CANCEL_HINTS_MAX, none older than ``horizon_s``."""
        now = time.monotonic()
        hints = self.cancel_hints
        hints.pop(tid, None)
        hints[tid] = now
        oldest_ok = now - horizon_s
        while hints:
            oldest = next(iter(hints))
            if len(hints) <= CANCEL_HINTS_MAX and hints[oldest] >= oldest_ok:
                break
            del hints[oldest]

    # --- drain -------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """No more runs start from ``ready``; every change wakes the drain."""
        self.draining = True
        self.changed.notify()

    @property
    def busy(self) -> bool:
        """Runs held, or claims in flight whose runs are not launched yet."""
        return bool(self.inflight) or self.claiming > 0
