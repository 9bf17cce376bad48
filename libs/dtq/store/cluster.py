"""A Redis Cluster beside redis-py's cluster client: the fast lane per node (script calls), and
keyless commands (SCAN of one queue's slot, and SCAN of every primary).

A call takes the lane of the node serving its hash tag, cached per tag and looked up again only
after a call did not run there (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``: the cluster
client then follows the redirect; none of those ran the script) or a dropped connection
(docs/performance.md, "Redis Cluster"). A SCAN over the whole prefix walks every primary in
turn, its cursor ``"<primary index>:<node cursor>"`` (``"0"`` starts and ends it); a slot map
change mid-walk may repeat or miss a key, as SCAN may anyway.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)

from dtq.store import transport
from dtq.store.connection import is_cluster
from dtq.store.keys import QueueKeys

# The error replies that say "not run here, ask the cluster client" (MovedError is an AskError).
NOT_RUN_HERE = (AskError, TryAgainError, ClusterDownError)
MAX_TAGS = 10_000  # tags cached per client at most (then forgotten all at once)
L = TypeVar("L")


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis hashes to its slot: the first ``{...}`` when not empty, else
    the whole key."""
    lo = key.find("{")
    hi = key.find("}", lo + 1) if lo >= 0 else -1
    return key[lo + 1 : hi] if lo >= 0 and hi > lo + 1 else key


class _Routes(Generic[L]):
    """Which lane (or lanes) of its node each hash tag's calls take, made once per node."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._by_tag: dict[str, L] = {}
        self._nodes: dict[str, tuple[Any, L]] = {}  # name: (what the lane was made of, lane)
        self.calls = 0  # calls answered on a lane (tests read it)

    def _source(self, node: Any) -> Any:
        """What a lane of ``node`` is made of; None: no lane for it."""
        raise NotImplementedError

    def _make(self, made_of: Any) -> L:
        raise NotImplementedError

    def _route(self, tag: str) -> L | None:
        """The lane of ``tag``'s node; None when there is no node yet (no slot map, a slot not
        covered) or no lane for it."""
        lane = self._by_tag.get(tag)
        if lane is not None:
            return lane
        try:
            node = self._client.get_node_from_key(tag)
        except (RedisError, RedisClusterException):  # the usual path then (it loads the map)
            return None
        made_of = self._source(node)
        if made_of is None:
            return None
        known = self._nodes.get(node.name)
        if known is None or known[0] is not made_of:
            known = self._nodes[node.name] = (made_of, self._make(made_of))
        if len(self._by_tag) >= MAX_TAGS:
            self._by_tag.clear()
        self._by_tag[tag] = known[1]
        return known[1]

    def forget(self) -> None:
        """Look every tag up again (the slot map may have changed)."""
        self._by_tag.clear()


class SyncRoutes(_Routes[transport.SyncLane]):
    """The blocking lanes of a cluster client: one per primary (``transport.SyncLane`` over the
    node's own client)."""

    def __init__(self, client: Any, *, replay_safe: bool = False) -> None:
        super().__init__(client)
        self._replay_safe = replay_safe

    def _source(self, node: Any) -> Any:
        return getattr(node, "redis_connection", None)

    def _make(self, made_of: Any) -> transport.SyncLane:
        return transport.SyncLane(made_of, replay_safe=self._replay_safe)

    def call(self, tag: str, args: Sequence[Any]) -> Any:
        """As ``SyncLane.call`` on the lane of ``tag``'s node; MISS also when the call was not
        run there (see the module's docstring) or no lane serves the tag."""
        lane = self._route(tag)
        if lane is None:
            return transport.MISS
        try:
            res = lane.call(args)
        except NOT_RUN_HERE:
            self.forget()
            return transport.MISS
        if res is transport.MISS:
            if not lane.connected:  # dropped: the node may be gone (a failover)
                self.forget()
        else:
            self.calls += 1
        return res


class _NodePool:
    """An asyncio cluster node's connections, as ``transport.AsyncLane`` takes them."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def get_connection(self) -> Any:
        return self.node.acquire_connection()

    async def release(self, conn: Any) -> None:
        self.node.release(conn)


class AsyncRoutes(_Routes[transport.AsyncLanes]):
    """:class:`SyncRoutes` for an asyncio cluster client: ``transport.AsyncLanes`` per primary,
    each lane a connection of the node's own. The caller runs the call (dtq.scripts.runner)."""

    def _source(self, node: Any) -> Any:
        return node if callable(getattr(node, "release", None)) else None  # (an older redis-py)

    def _make(self, made_of: Any) -> transport.AsyncLanes:
        return transport.AsyncLanes(self._client, _NodePool(made_of))

    def free(self, tag: str) -> transport.AsyncLane | None:
        """A lane not busy on ``tag``'s node, or None (the cluster client's path then)."""
        lanes = self._route(tag)
        return None if lanes is None else lanes.free()


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
