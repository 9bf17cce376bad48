"""Writing run outcomes: fenced, batched per round trip, retried while Redis is away."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq_worker.batcher import Batcher
from dtq_worker.faults import Backoff, is_transient

if TYPE_CHECKING:
    from dtq_worker.worker import Worker

log = logging.getLogger("dtq.outcomes")


@dataclass(frozen=True, slots=True)
class Outcome:
    queue: str
    item: sc.Success | sc.Failure


class OutcomeWriter:
    """Sends outcomes in batches (one pipeline per flush) and reports the fence's verdict.

    Verdicts: ``succeeded`` / ``cancelled`` (stored), ``scheduled`` (retry), ``failed``,
    ``stale`` (the run no longer owns the task; nothing was written).
    """

    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self._batcher: Batcher[Outcome, str] = Batcher(self._flush)

    async def write(self, outcome: Outcome, still_owned: Any) -> str | None:
        """Store ``outcome``, retrying transient errors while ``still_owned()`` is true.

        Returns the verdict, or None when the run lost its claim or the worker gave up.
        """
        backoff = Backoff(log, "outcome write")
        while True:
            try:
                verdict = await self._batcher.submit(outcome)
                backoff.ok()
                return verdict
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.w.metrics.redis_errors.labels("outcome").inc()
                if not still_owned() or self.w.self_stopping:
                    return None
                await asyncio.sleep(backoff.failed(exc))

    async def _flush(self, batch: Sequence[Outcome]) -> list[str]:
        w = self.w
        s = w.settings
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, o in enumerate(batch):
            groups[(o.queue, "ok" if isinstance(o.item, sc.Success) else "fail")].append(i)
        verdicts: list[str] = [""] * len(batch)
        order = []
        calls = []
        for (queue, kind), idx in groups.items():
            qk = w.keys.queue(queue)
            if kind == "ok":
                call = sc.complete_call(
                    qk, w.worker_id, [batch[i].item for i in idx],  # type: ignore[misc]
                    s.events_maxlen, s.result_ttl_s,
                )  # fmt: skip
            else:
                call = sc.fail_call(
                    qk, w.worker_id, [batch[i].item for i in idx],  # type: ignore[misc]
                    s.events_maxlen, max(s.result_ttl_s, s.dlq_ttl_s),
                )  # fmt: skip
            calls.append(call)
            order.append((kind, idx))
        if len(calls) == 1:
            # The usual flush is one script call: sent alone it is one round trip, where a
            # pipeline would first ask SCRIPT EXISTS.
            replies = [await w.scripts.run(calls[0])]
        else:
            async with w.redis.pipeline(transaction=False) as pipe:
                for call in calls:
                    await w.scripts.run(call, pipe)
                replies = await pipe.execute()
        for (kind, idx), raw in zip(order, replies, strict=True):
            if kind == "ok":
                for i, stored in zip(idx, sc.parse_complete(raw), strict=True):
                    item = batch[i].item
                    assert isinstance(item, sc.Success)
                    verdicts[i] = item.status if stored else "stale"
            else:
                for i, v in zip(idx, sc.parse_strings(raw), strict=True):
                    verdicts[i] = v
        return verdicts
