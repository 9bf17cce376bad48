"""History: per-minute counts per queue that outlive every process (docs/operations.md,
"History").

An hour string ``P:{q}:h:<hour>`` holds :data:`SLOTS` unsigned 32-bit big-endian counters per
minute (:data:`COUNTERS`, then the run-time buckets; ``enqueued`` lives in the minute keys
``P:{q}:he:<minute>`` until retention folds it).
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from redis.client import NEVER_DECODE

if TYPE_CHECKING:
    from dtq.store.keys import QueueKeys

COUNTERS = ("enqueued", "succeeded", "failed", "retried", "cancelled")
BOUNDS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)
"""Upper bounds (seconds, inclusive) of the run-time buckets; one more bucket holds the rest."""
NBUCKETS = len(BOUNDS) + 1
SLOTS = len(COUNTERS) + NBUCKETS  # 16: the Lua side knows each counter's slot by number
HOUR_BYTES = 60 * SLOTS * 4
PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
MAX_MINUTES = 7 * 24 * 60 * 4  # a bound on one read (4 weeks), whatever the retention


def bucket_of(seconds: float) -> int:
    """The run-time bucket of a run that took ``seconds``."""
    return bisect.bisect_left(BOUNDS, seconds)


def percentile(hist: list[int], q: float) -> float | None:
    """The ``q`` quantile of the runs counted in ``hist``, as the upper bound of the bucket that
    holds it (so the true value is at most that); the open last bucket answers its lower bound.
    None when no run was counted."""
    total = sum(hist)
    if total == 0:
        return None
    # The first bucket whose running count reaches the quantile's rank.
    i = bisect.bisect_left(list(itertools.accumulate(hist)), max(1, math.ceil(q * total)))
    return BOUNDS[min(i, len(BOUNDS) - 1)]


def iso_minute(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ints(raw: bytes | None) -> tuple[int, ...]:
    """An hour key's counters (a shorter string: the minutes after its last write)."""
    k = len(raw) // 4 if raw else 0
    return struct.unpack_from(f">{k}I", raw) if raw else ()


async def read(
    redis: Any, queues: list[QueueKeys], minutes: int, step: int = 1
) -> list[dict[str, Any]]:
    """The last ``minutes`` minutes (the current one included), summed over the physical
    ``queues``, in aligned buckets of ``step`` minutes, oldest first. One ``MGET`` per queue
    (so a counter folded meanwhile counts once), and one ``TIME``."""
    secs, _ = await redis.time()
    now_min = int(secs) // 60
    n = -(-minutes // step)  # buckets, each starting on a multiple of step
    first = (now_min // step - n + 1) * step
    hours = range(first // 60, now_min // 60 + 1)
    sums = [[0] * SLOTS for _ in range(n)]
    for qk in queues:
        mins = range(first, now_min + 1)
        raws = await redis.execute_command(
            "MGET",
            *(f"{qk.hist_base}{h}" for h in hours),
            *(f"{qk.hist_enq_base}{m}" for m in mins),
            **{NEVER_DECODE: []},
        )
        for m, c in zip(mins, raws[len(hours) :], strict=True):
            if c is not None:  # an enqueue counter not folded yet
                sums[(m - first) // step][0] += int(c)
        for h, raw in zip(hours, raws, strict=False):
            vals = ints(raw)
            for at in range(0, len(vals), SLOTS):
                m = h * 60 + at // SLOTS
                if first <= m <= now_min:
                    row = sums[(m - first) // step]
                    for j, v in enumerate(vals[at : at + SLOTS]):
                        row[j] += v
    return [_bucket(first + i * step, row) for i, row in enumerate(sums)]


def _bucket(minute: int, row: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"minute": iso_minute(minute)}
    out.update(zip(COUNTERS, row, strict=False))
    hist = row[len(COUNTERS) :]
    out["runs"] = sum(hist)
    for name, q in PERCENTILES:
        out[name] = percentile(hist, q)
    return out
