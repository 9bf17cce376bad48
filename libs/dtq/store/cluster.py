"""Keyless commands on a Redis Cluster: SCAN of one queue's slot, and SCAN of every primary.

A queue's keys share its hash tag, so they live in one slot on one node: a SCAN for them goes
to that node. A SCAN over the whole prefix (retention, a task list across queues) walks every
primary in turn; its cursor is ``"<primary index>:<node cursor>"`` then (``"0"`` starts and
ends a walk, as SCAN's own cursor does on one server). A walk in progress while the slot map
changes (a failover, a reshard) may list a key twice or miss one moved meanwhile, as a SCAN
may on one server for keys changed during it: the callers already take that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dtq.store.connection import is_cluster
from dtq.store.keys import QueueKeys


def _one(reply: Any) -> tuple[int, list[Any]]:
    """SCAN's reply from one node: redis-py's cluster client gives ({node: cursor}, keys)."""
    cursor, keys = reply
    if isinstance(cursor, dict):
        cursor = next(iter(cursor.values()), 0)
    return int(cursor), keys


def scan_slot(client: Any, key: str, cursor: int, match: str, count: int) -> tuple[int, list[Any]]:
    """One SCAN call of a blocking client at the node holding ``key``'s slot."""
    if not is_cluster(client):
        return _one(client.scan(cursor, match=match, count=count))
    node = client.get_node_from_key(key)
    return _one(client.scan(cursor, match=match, count=count, target_nodes=node))


async def ascan_slot(
    client: Any, key: str, cursor: int, match: str, count: int
) -> tuple[int, list[Any]]:
    """:func:`scan_slot` for an asyncio client (which learns the slot map lazily)."""
    if not is_cluster(client):
        return _one(await client.scan(cursor, match=match, count=count))
    await client.initialize()
    node = client.get_node_from_key(key)
    return _one(await client.scan(cursor, match=match, count=count, target_nodes=node))


async def scan_step(client: Any, cursor: str, match: str, count: int) -> tuple[str, list[Any]]:
    """One SCAN call of a walk over every key matching ``match`` (every primary's, on a
    cluster); returns the next cursor (``"0"``: the walk is over) and the keys."""
    if not is_cluster(client):
        nxt, keys = _one(await client.scan(int(cursor), match=match, count=count))
        return str(nxt), keys
    await client.initialize()
    primaries = sorted(client.get_primaries(), key=lambda n: n.name)
    index, _, at = cursor.partition(":") if ":" in cursor else ("0", "", cursor)
    i = int(index)
    if i >= len(primaries):  # fewer primaries than when the walk began: it is over
        return "0", []
    nxt, keys = _one(
        await client.scan(int(at), match=match, count=count, target_nodes=primaries[i])
    )
    if nxt != 0:
        return f"{i}:{nxt}", keys
    if i + 1 < len(primaries):
        return f"{i + 1}:0", keys
    return "0", keys


# --- the task records of one queue (every SCAN over them goes through these) ----------------


def scan_tasks(client: Any, qk: QueueKeys, cursor: int, count: int) -> tuple[int, list[Any]]:
    """One SCAN call over ``qk``'s task record keys (at its slot's node)."""
    return scan_slot(client, qk.task_base, cursor, qk.task_pattern, count)


async def ascan_tasks(client: Any, qk: QueueKeys, cursor: int, count: int) -> tuple[int, list[Any]]:
    """:func:`scan_tasks` for an asyncio client."""
    return await ascan_slot(client, qk.task_base, cursor, qk.task_pattern, count)


def task_key_pages(client: Any, qk: QueueKeys, count: int) -> Iterator[list[Any]]:
    """Every task record key of ``qk``, one SCAN reply at a time (some may be empty)."""
    cursor = 0
    while True:
        cursor, keys = scan_tasks(client, qk, cursor, count)
        yield keys
        if cursor == 0:
            return
