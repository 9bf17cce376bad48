"""Which Redis errors are transient (retry with backoff) and which are not."""

from __future__ import annotations

import logging
import random
import time

import redis.exceptions as rex

from dtq.errors import describe
from dtq.store.eviction import is_oom

_CODES = ("LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
# "non local key": a script met a key of its slot that a migration already moved.
_TRANSIENT_REPLIES = (*_CODES, "max number of clients", "non local key")
# redis-py's cluster client during a failover or a migration (outside the ResponseError family).
_TRANSIENT_CLUSTER = (rex.SlotNotCoveredError, rex.ClusterError, rex.AskError, rex.TryAgainError)
_CLUSTER_UNREACHABLE = "Redis Cluster cannot be connected"


def is_transient(exc: BaseException) -> bool:
    """Connection refused/reset, timeouts, restarts, failovers, too many clients, OOM."""
    # (LOADING's BusyLoadingError is a ConnectionError, the built-in ConnectionError an OSError)
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError | OSError | rex.ReadOnlyError):
        return True
    if isinstance(exc, _TRANSIENT_CLUSTER):
        return True
    if isinstance(exc, rex.RedisClusterException) and _CLUSTER_UNREACHABLE in str(exc):
        return True
    if is_oom(exc):  # Redis at maxmemory (noeviction): writes land again once memory frees
        return True
    if isinstance(exc, rex.ResponseError):
        text = str(exc)
        return any(text.startswith(p) or p in text for p in _TRANSIENT_REPLIES)
    return False


def is_nogroup(exc: BaseException) -> bool:
    return isinstance(exc, rex.ResponseError) and "NOGROUP" in str(exc)


# Backoffs sharing a name log one warning per outage: again only after this long quiet.
_SAME_EPISODE_S = 2.0
_last_warned: dict[str, float] = {}


class Backoff:
    """Capped, jittered exponential backoff that logs once per episode."""

    def __init__(self, log: logging.Logger, what: str, base: float = 0.1, cap: float = 5.0):
        self.log, self.what, self.base, self.cap = log, what, base, cap
        self.failures = 0

    def failed(self, exc: BaseException) -> float:
        if self.failures == 0:
            now = time.monotonic()
            if now - _last_warned.get(self.what, -_SAME_EPISODE_S) >= _SAME_EPISODE_S:
                why = describe(exc)
                self.log.warning("%s: Redis error, retrying with backoff: %s", self.what, why)
            _last_warned[self.what] = now
        self.failures += 1
        delay = min(self.cap, self.base * 2 ** min(self.failures, 16))
        return float(delay * random.uniform(0.5, 1.0))

    def ok(self) -> None:
        if self.failures:
            self.log.info("%s: Redis reachable again after %d failures", self.what, self.failures)
        self.failures = 0
