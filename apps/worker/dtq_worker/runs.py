"""A run in flight on this worker and the reasons it can be stopped early."""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dtq.context import TaskContext
from dtq.scripts import Claimed, RunRef
from dtq.store.keys import make_task_id


@dataclass(slots=True)
class Hooked:
    """What middleware needs of a run beyond the run itself: made only when there is some."""

    ctx: TaskContext
    result: Any = None
    raised: BaseException | None = None  # what the around_task chain raised


class StopReason(Enum):
    CLAIM_LOST = "claim lost"  # reclaimed by another worker: write nothing
    CANCELLED = "cancelled"  # a user asked: write "cancelled"
    SHUTDOWN = "shutdown"  # drain ran out: hand back through requeue.lua


@dataclass(eq=False)
class Run:
    claimed: Claimed
    started_mono: float = field(default_factory=time.monotonic)  # reset when its body starts
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
    hooked: Hooked | None = None  # only when the app has middleware (Executor._around)

    @property
    def key(self) -> tuple[str, str]:
        return (self.claimed.queue, self.claimed.tid)

    @property
    def ref(self) -> RunRef:
        c = self.claimed
        return RunRef(c.tid, c.eid, c.attempt)

    @property
    def task_id(self) -> str:
        return make_task_id(self.claimed.queue, self.claimed.tid)

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
        runs its coroutine, cleanup included (Worker._run's release of the slot): a run stopped
        that early is left to start, and Executor.execute ends it by its stop reason."""
        coro: Any = self.task.get_coro() if self.task is not None else None
        return coro is not None and inspect.getcoroutinestate(coro) != inspect.CORO_CREATED
