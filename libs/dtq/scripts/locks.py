"""lock.lua's and unlock.lua's wrappers: a lease held by one worker (the scheduler's per queue,
the retention pass's)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from dtq.scripts.runner import Call


class Lock(IntEnum):
    """lock.lua's reply."""

    NOT_HELD = 0
    """Another token holds the lease."""
    HELD = 1
    """The caller holds the lease after the call (taken, or extended)."""


class Unlock(IntEnum):
    """unlock.lua's reply."""

    NOT_HOLDER = 0
    RELEASED = 1


def lock_call(key: str, token: str, lease_ms: int) -> Call:
    return Call("lock", [key], [token, lease_ms])


def parse_lock(raw: Any) -> Lock:
    return Lock(int(raw))


def unlock_call(key: str, token: str) -> Call:
    return Call("unlock", [key], [token])


def parse_unlock(raw: Any) -> Unlock:
    return Unlock(int(raw))
