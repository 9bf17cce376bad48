"""State that belongs to the process that made it, reset in a forked child (a pre-forking web
server's workers): the threads a parent's object relies on (a reader, the callers of a call in
flight) stay behind in the parent, and a lock with them if one held it.

``forkreset.track(obj)``: ``obj._reset()`` runs in every child forked after it, while ``obj``
lives (a weak reference: tracking keeps nothing alive)."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Resettable(Protocol):
    def _reset(self) -> None: ...


_ALL: weakref.WeakSet[Resettable] = weakref.WeakSet()


def track(obj: Resettable) -> None:
    _ALL.add(obj)


def _after_fork() -> None:
    for obj in list(_ALL):
        obj._reset()


os.register_at_fork(after_in_child=_after_fork)
