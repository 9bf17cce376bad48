"""Writing run outcomes: fenced, batched per round trip, retried while Redis is away."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq_worker.batcher import Batcher
from dtq_worker.faults import Backoff, is_transient

if TYPE_CHECKING:
    from dtq.settings import Settings
    from dtq_worker.env import WorkerEnv
    from dtq_worker.slots import Slots

log = logging.getLogger("dtq.outcomes")


# Runs.take: (queue, a claim's reply, when it was sent (monotonic), the slots it reserved).
Take = Callable[[str, sc.ClaimBatch, float, int], None]


@dataclass(slots=True)
class Outcome:
    queue: str
    item: sc.Success | sc.Failure
    held: bool = False  # the run's slot is reserved for the refill this write claims
    bucket: int | str = ""  # the run's run-time bucket for the history (dtq.stats.bucket_of)


class OutcomeWriter:
    """Sends outcomes in batches (one pipeline per flush); reports the fence's verdict:
    ``succeeded``/``cancelled``, ``scheduled`` (retry), ``failed`` or ``stale`` (not written)."""

    def __init__(self, env: WorkerEnv, slots: Slots, take: Take) -> None:
        """``take``: where a write's refill claim goes (Runs.take), before the batch resumes."""
        self.env = env
        self.slots = slots
        self.take = take
        # Two writes in flight of at most half the slots each (docs/design.md, "The worker").
        self._batcher: Batcher[Outcome, str] = Batcher(
            self._flush, max_batch=max(1, (env.settings.worker_concurrency + 1) // 2), flights=2
        )

    async def write(self, outcome: Outcome, still_owned: Any) -> str | None:
        """Store ``outcome``, retrying transient errors while ``still_owned()``; the verdict, or
        None when the run lost its claim or the worker gave up."""
        if isinstance(outcome.item, sc.Success) and self._can_refill(outcome.queue):
            outcome.held = True
            self.slots.reserve(outcome.queue, 1)
        backoff: Backoff | None = None  # made on the first failure (most writes have none)
        while True:
            try:
                verdict = await self._batcher.submit(outcome)
                if backoff is not None:
                    backoff.ok()
                return verdict
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.env.metrics.redis_errors.labels("outcome").inc()
                if not still_owned() or self.env.self_stopping:
                    return None
                if backoff is None:
                    backoff = Backoff(log, "outcome write")
                await asyncio.sleep(backoff.failed(exc))

    def _can_refill(self, queue: str) -> bool:
        """Whether a successful run's write claims the run that takes its slot: only for the
        first queue (the poll keeps the order), unpartitioned, while the poll is not idle."""
        env = self.env
        return (
            queue == env.queues[0]
            and queue not in env.partitions_of
            and not env.stopping
            and not env.idle
            and env.healthy.is_set()
            and env.evicting is None
            and queue not in self.slots.recovering
        )

    async def _flush(self, batch: Sequence[Outcome]) -> list[str]:
        env, s = self.env, self.env.settings
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, o in enumerate(batch):
            groups[(o.queue, "ok" if isinstance(o.item, sc.Success) else "fail")].append(i)
        verdicts: list[str] = [""] * len(batch)
        order = []
        calls = []
        refill: tuple[str, int, sc.Call] | None = None  # slots reserved for this flush's claim
        try:
            for (queue, kind), idx in groups.items():
                qk = env.keys.queue(queue)
                if kind == "ok":
                    # The slots held for this batch go to its claim (or back, if it cannot).
                    held = 0
                    for i in idx:
                        if batch[i].held:
                            batch[i].held = False
                            held += 1
                    claim = held if held and self._can_refill(queue) else 0
                    if held and not claim:
                        self.slots.unreserve(queue, held, wake=True)  # the poll loop takes them
                    call = sc.complete_call(
                        qk, env.worker_id, [batch[i].item for i in idx],  # type: ignore[misc]
                        s.events_maxlen, s.result_ttl_s, claim, s.fair, _hist(s, batch, idx),
                        s.group_cap(queue),
                    )  # fmt: skip
                    if claim:
                        refill = (queue, held, call)
                else:
                    call = sc.fail_call(
                        qk,
                        env.worker_id,
                        [batch[i].item for i in idx],  # type: ignore[misc]
                        s.events_maxlen,
                        max(s.result_ttl_s, s.dlq_ttl_s),
                        _hist(s, batch, idx),
                    )
                calls.append(call)
                order.append((kind, idx))
            sent = time.monotonic()
            if len(calls) == 1:  # alone: one round trip (a pipeline first asks SCRIPT EXISTS)
                replies = [await env.scripts.run(calls[0])]
            else:
                async with env.redis.pipeline(transaction=False) as pipe:
                    for call in calls:
                        await env.scripts.run(call, pipe)
                    replies = await pipe.execute()
        except BaseException as exc:
            if refill is not None:
                self.slots.unreserve(refill[0], refill[1])
                # The refill claim may have run, its reply lost (a single call reports it itself).
                lost = env.scripts.on_reply_lost
                if len(calls) > 1 and lost is not None and is_transient(exc):
                    lost(refill[2])
            raise
        for (kind, idx), raw in zip(order, replies, strict=True):
            if kind == "ok":
                queue = batch[idx[0]].queue
                stored_flags, claimed = sc.parse_complete_claim(queue, raw)
                if refill is not None and refill[0] == queue:
                    if claimed is None or claimed.missing_streams:
                        self.slots.unreserve(queue, refill[1])
                    else:  # Runs.take gives its reserved slots back as it launches its runs
                        self.take(queue, claimed, sent, refill[1])
                for i, stored in zip(idx, stored_flags, strict=True):
                    item = batch[i].item
                    assert isinstance(item, sc.Success)
                    verdicts[i] = item.status if stored else "stale"
            else:
                for i, v in zip(idx, sc.parse_verdicts(raw), strict=True):
                    verdicts[i] = v
        return verdicts


def _hist(s: Settings, batch: Sequence[Outcome], idx: list[int]) -> sc.History | None:
    """The history part of one outcome call (dtq.stats): counted in the same call."""
    if not s.stats_retention_h:
        return None
    return sc.History(s.stats_retention_h * 3600, [batch[i].bucket for i in idx])
