"""Which task names the live workers run, so ``dtq enqueue`` can warn about a name no worker
runs (such a task waits, then fails on the worker that takes it).

Each worker publishes its task names (a JSON list) in the ``tasks`` field of its heartbeat
hash, which expires with the worker. When the per-queue declarations hash ``P:{q}:decl``
(task name -> declared defaults, written by workers at start; see :mod:`dtq.declared`) is
there, it answers instead.
"""

from __future__ import annotations

import json
from typing import Any

from dtq.keys import Keys

TASKS_FIELD = "tasks"


def decl_key(keys: Keys, queue: str) -> str:
    """The per-queue declarations hash ``P:{q}:decl`` (task name -> declared defaults)."""
    return keys.queue(queue).decl


async def declared_by_workers(r: Any, keys: Keys, queue: str, name: str) -> bool | None:
    """Whether some worker declares task ``name`` for ``queue``.

    None when nothing is known: no declarations hash and no live worker that publishes its
    names (none running, or all of an older version).
    """
    dk = decl_key(keys, queue)
    if await r.exists(dk):
        return bool(await r.hexists(dk, name))
    ids = await r.zrange(keys.workers, 0, -1)
    if not ids:
        return None
    async with r.pipeline(transaction=False) as pipe:
        for wid in ids:
            pipe.hmget(keys.worker(wid), TASKS_FIELD, "queues", "status")
        rows = await pipe.execute()
    known = False
    for tasks, queues, status in rows:
        if tasks is None or status == "stopped":
            continue
        if queue not in (queues or "").split(","):
            continue
        known = True
        if name in json.loads(tasks):
            return True
    return False if known else None


def task_names(raw: str | None) -> list[str]:
    """A worker's published task names (its heartbeat's ``tasks`` field); [] when absent or
    not a JSON list of names."""
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        return []
    return sorted(n for n in names if isinstance(n, str)) if isinstance(names, list) else []
