"""Admin's reads of the history: per-minute counts per queue (dtq.stats)."""

from __future__ import annotations

from typing import Any

from dtq import stats
from dtq.admin.common import check_queue_name
from dtq.admin.core import AdminCore
from dtq.errors import InvalidRequest


class HistoryOps(AdminCore):
    async def stats(
        self, *, queue: str | None = None, minutes: int = 60, step: int = 1
    ) -> list[dict[str, Any]]:
        """Per-minute counts of ``queue`` (its partitions summed; every known queue summed when
        None) over the last ``minutes`` minutes, in buckets of ``step`` minutes, oldest first:
        each has ``minute`` (ISO 8601, UTC, the bucket's first), the :data:`dtq.stats.COUNTERS`,
        ``runs`` (runs timed) and the run-time percentiles ``p50``, ``p95``, ``p99`` (seconds,
        an upper bound; None without runs). Reads two ``MGET`` per physical queue (one more per
        day of minutes past the first)."""
        if not (1 <= minutes <= stats.MAX_MINUTES and 1 <= step <= minutes):
            raise InvalidRequest(f"need 1 <= minutes <= {stats.MAX_MINUTES}, 1 <= step <= minutes")
        if queue is not None:
            check_queue_name(queue)
        qks = [self.keys.queue(q) for q in await self._physical_of(queue)]
        return await stats.read(self._r, qks, minutes, step)
