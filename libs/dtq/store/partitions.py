"""Partitioned queues (``DTQ_QUEUE_PARTITIONS=bulk=4``): one logical queue over several hash tags
(docs/operations.md, "Partitioned queues").

Partition 0 of ``bulk`` is the queue ``bulk`` itself; partition ``i`` > 0 is the internal queue
``bulk~i``, a queue like any other to the scripts and the worker (``~`` is not allowed in a queue
name). A task id carries its partition (``bulk:<tid>~2``), so its keys are found without a scan.
The count is recorded in ``P:partitions`` and checked by clients and workers: a different count
is refused (:class:`dtq.errors.ConfigError`) while tasks wait in the recorded partitions.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import zlib
from collections.abc import Callable, Generator, Iterable, Mapping
from functools import partial
from typing import Any

from dtq.errors import ConfigError
from dtq.store.keys import Keys, QueueRef

MAX_PARTITIONS = 256
_spread = itertools.count()  # tasks without a key go round the partitions


def physical(queue: str, i: int) -> str:
    """The internal queue holding partition ``i`` of ``queue``."""
    return QueueRef(queue, i).name


_PHYSICAL_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}(~[1-9][0-9]{0,2})?\Z")


def is_physical(name: str) -> bool:
    """Whether ``name`` is a queue name or a partition's (``q~i``)."""
    return _PHYSICAL_RE.match(name) is not None


def logical(name: str) -> str:
    """The queue a physical queue name belongs to (itself when unpartitioned)."""
    return QueueRef.parse(name).queue


def index(name: str) -> int:
    """The partition a physical queue name holds (0 for the logical queue itself)."""
    return QueueRef.parse(name).partition


def expand(queues: Iterable[str], counts: Mapping[str, int]) -> list[str]:
    """Every physical queue of ``queues``, in order, each queue's partitions together."""
    return [physical(q, i) for q in queues for i in range(counts.get(q, 1))]


def place(queue: str, n: int, key: str | None) -> str:
    """The physical queue a new task of ``queue`` (``n`` partitions) goes to: the partition of
    ``key`` (CRC32, the same in every process), or the next one round the partitions."""
    if key is None:
        return physical(queue, next(_spread) % n)
    return physical(queue, zlib.crc32(key.encode("utf-8", "surrogatepass")) % n)


# --- the count recorded in Redis ---


def _waiting_calls(pipe: Any, keys: Keys, queue: str, n: int) -> None:
    for i in range(n):
        qk = keys.queue(physical(queue, i))
        for stream in qk.streams:
            pipe.xlen(stream)
        pipe.zcard(qk.sched)


def _recorded(raw: Any) -> int:
    try:
        return 1 if raw is None else int(raw)
    except ValueError:
        return 0  # not a count: a mismatch, fixed by the next record


def refusal(queue: str, recorded: int, wanted: int, waiting: int) -> str:
    return (
        f"queue {queue!r} has {recorded} partition(s) in Redis but DTQ_QUEUE_PARTITIONS gives "
        f"{wanted}, and {waiting} task(s) wait in them: drain the queue before changing the "
        "count (docs/operations.md, 'Partitioned queues')"
    )


def _wanted(queues: Iterable[str], counts: Mapping[str, int]) -> dict[str, int]:
    return {q: counts.get(q, 1) for q in dict.fromkeys(logical(q) for q in queues)}


def register_steps(
    keys: Keys, counts: Mapping[str, int], queues: Iterable[str]
) -> Generator[Callable[[Any], Any], Any, None]:
    """Add ``queues`` (physical names) to the registry and check their logical queues' partition
    counts against the record, in one round trip. A changed count is recorded when nothing waits
    in the recorded partitions; else :class:`ConfigError`. Written as the I/O steps of
    dtq.sdk.client (functions of the Redis client); :func:`aregister` does them for the worker."""
    names = list(queues)
    wanted = _wanted(names, counts)

    def first(pipe: Any) -> None:
        pipe.sadd(keys.queues, *names)
        pipe.hmget(keys.partitions, list(wanted))

    _, raws = yield partial(_pipelined, first)
    for q, have, want in _changed(wanted, raws):
        replies = yield partial(_pipelined, partial(_waiting_calls, keys=keys, queue=q, n=have))
        if waiting := sum(int(x) for x in replies):
            raise ConfigError(refusal(q, have, want, waiting))
        if want == 1:
            yield partial(_hdel, keys.partitions, q)
        else:
            yield partial(_hset, keys.partitions, q, str(want))


def _pipelined(fill: Callable[[Any], None], r: Any) -> Any:
    pipe = r.pipeline(transaction=False)
    fill(pipe)
    return pipe.execute()


def _hdel(key: str, field: str, r: Any) -> Any:
    return r.hdel(key, field)


def _hset(key: str, field: str, value: str, r: Any) -> Any:
    return r.hset(key, field, value)


async def aregister(
    redis: Any, keys: Keys, counts: Mapping[str, int], queues: Iterable[str]
) -> None:
    """:func:`register_steps` on an asyncio client (the worker, which has no dtq client)."""
    steps, reply = register_steps(keys, counts, queues), None
    with contextlib.suppress(StopIteration):
        while True:
            reply = await steps.send(reply)(redis)


def _changed(wanted: dict[str, int], raws: list[Any]) -> list[tuple[str, int, int]]:
    """(queue, recorded, wanted) of each queue whose count differs from the record."""
    out = []
    for (q, want), raw in zip(wanted.items(), raws, strict=True):
        have = _recorded(raw)
        if have != want:
            out.append((q, have, want))
    return out


def siblings(queues: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each physical queue of a partitioned queue in ``queues`` -> all its queue's partitions
    there (unpartitioned queues are left out)."""
    by: dict[str, list[str]] = {}
    for q in queues:
        by.setdefault(logical(q), []).append(q)
    return {q: tuple(g) for g in by.values() if len(g) > 1 for q in g}


def poll_order(queues: list[str], turn: int) -> list[str]:
    """``queues`` with each partitioned queue's partitions rotated to start at ``turn``: a claim
    pass fills its slots from the first partitions that have work, so successive passes start
    at successive partitions and none is starved by a busy other."""
    out: list[str] = []
    i = 0
    while i < len(queues):
        name = logical(queues[i])
        j = i + 1
        while j < len(queues) and logical(queues[j]) == name:
            j += 1
        group = queues[i:j]
        k = turn % len(group)
        out += group[k:] + group[:k]
        i = j
    return out


def within(queue: str, names: Iterable[Any]) -> list[str]:
    """``queue`` and those of ``names`` (e.g. the registry) that are partitions of it."""
    parts = {str(n) for n in names if logical(str(n)) == queue and str(n) != queue}
    return [queue, *sorted(parts, key=index)]
