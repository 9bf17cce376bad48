"""A worker's capacity and cancel hints, with no I/O (invariants: docs/design.md, "The slots")."""

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

    # Its lease is held since no earlier than this (monotonic): its claim's or last renewal's send.
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
        """Whether its task's coroutine has begun (cancelled before, it would skip its cleanup:
        Executor.execute ends it by its stop reason instead)."""
        coro: Any = self.task.get_coro() if self.task is not None else None
        return coro is not None and inspect.getcoroutinestate(coro) != inspect.CORO_CREATED


class Signal:
    """Wakes every current waiter (no memory: a waiter checks its condition before it waits)."""

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
        """``lease_s``: a run's lease is surely held this long after its claim or renewal;
        ``start``: begins a run's task; ``partitions_of``: partition -> all of its queue's."""
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
        self.cancel_hints: dict[str, float] = {}  # tid -> when heard, oldest first
        self.draining = False
        self.recovering: set[str] = set()  # no claim of these is sent (recovery.py)
        self.changed = Signal()  # a slot freed; while draining, any change
        self._claims = Signal()  # a claim's reservation was given back

    @property
    def unheld(self) -> int:
        """Places for new runs: the capacity less the runs held and the slots reserved."""
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
        """Give back ``n`` reserved slots; ``wake``: they are free now (else its runs launch)."""
        self.claiming -= n
        self.claiming_per_queue[queue] -= n
        self._claims.notify()
        if wake or self.draining:
            self.changed.notify()

    async def claims_settled(self, queue: str | None, timeout: float | None = None) -> bool:
        """Until no claim (of ``queue``, or any) is in flight; False on ``timeout``."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while self.claiming_per_queue.get(queue, 0) if queue is not None else self.claiming:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await self._claims.wait(left)
        return True

    def launch(self, run: Run) -> bool:
        """Hold ``run``. True: start its task now (it has a slot, or was cancelled already);
        False: it waits in ``ready`` for a slot or a renewed lease."""
        self.inflight[run.key] = run
        q = run.claimed.queue
        self.active += 1
        self.active_per_queue[q] = self.active_per_queue.get(q, 0) + 1
        run.holds_slot = True
        if self.cancel_hints:
            heard = self.cancel_hints.pop(run.claimed.tid, None)
            # Only a hint heard after the claim was sent is this run's.
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
        """Whether the run's lease is surely still held (claimed or renewed within ``lease_s``)."""
        return run.leased_mono >= time.monotonic() - self.lease_s

    def release(self, run: Run) -> None:
        """The run's body is over: a run claimed ahead takes its slot (forget wakes the poll)."""
        if run.holds_slot:
            run.holds_slot = False
            self.active -= 1
            self.active_per_queue[run.claimed.queue] -= 1
            if self.ready:
                self.fill()

    def fill(self) -> None:
        """Start runs claimed ahead while bodies are short of the concurrency and leases held."""
        ready = self.ready
        while ready and not self.draining and self.active - len(ready) < self.concurrency:
            if not self.fresh(ready[0]):
                break
            run = ready.popleft()
            run.waiting = False
            self._start(run)

    def forget(self, run: Run) -> bool:
        """The run is no longer this worker's: drop it and its slot. False when it was not held."""
        if self.inflight.get(run.key) is not run:
            return False
        del self.inflight[run.key]
        if run.waiting:  # its body never started
            self.ready.remove(run)
            run.waiting = False
        self.release(run)
        # Wakes the poll loop only for a slot no claim holds, and the drain.
        if self.draining or self.capacity - self.active - self.claiming > 0:
            self.changed.notify()
        return True

    def take_ready(self) -> list[Run]:
        """Every run waiting for a slot, as they are (still held: forget each when done)."""
        return list(self.ready)

    def hint(self, tid: str, horizon_s: float) -> None:
        """Keep a cancel hint for a task not held here (at most CANCEL_HINTS_MAX, ``horizon_s``)."""
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

    def begin_drain(self) -> None:
        """No more runs start from ``ready``; every change wakes the drain."""
        self.draining = True
        self.changed.notify()

    @property
    def busy(self) -> bool:
        """Runs held, or claims in flight whose runs are not launched yet."""
        return bool(self.inflight) or self.claiming > 0
