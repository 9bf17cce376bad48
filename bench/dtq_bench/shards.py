"""A private Redis Cluster of N masters (no replicas) for workload S, on free ports.

Each node is a :class:`~dtq_bench.server.BenchRedis` started with ``--cluster-enabled yes``
(its CPU is measured); ``tools/redis_cluster.py`` (shared with the tests' cluster) forms them,
the 16,384 slots split into N equal ranges, so a one-node "cluster" is built the same way as a
three-node one and dtq talks to both through ``redis+cluster://``. No replicas: workload S
measures the CPU a shard spends per task, and a replica's share of it (applying the master's
stream) is not dtq's choice to make.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.crc import key_slot

from dtq.store.keys import Keys
from dtq_bench.server import BenchRedis
from tools.redis_cluster import cluster_port, form, node_args, slot_ranges, wait_ready


class Shards:
    """``with Shards(3) as c: c.url``; :meth:`flush` between runs, per-node CPU counters."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.nodes: list[BenchRedis] = []
        self.ranges = slot_ranges(n)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> Shards:
        try:
            for _ in range(self.n):
                node = BenchRedis(port=cluster_port(), extra_args=tuple(node_args(5000)))
                self.nodes.append(node.start())
            ports = [node.port for node in self.nodes]
            form(ports, self.n)
            wait_ready(ports, self.n, 30.0, f"the bench cluster of {self.n}")
        except BaseException:
            self.stop()
            raise
        return self

    def node_of_slot(self, slot: int) -> int:
        return next(i for i, (lo, hi) in enumerate(self.ranges) if lo <= slot <= hi)

    def flush(self) -> None:
        for node in self.nodes:
            node.flush()

    def cpu_by_node(self) -> list[float]:
        return [node.cpu_s() for node in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> Shards:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def queues_per_shard(prefix: str, shards: int, per_shard: int = 1) -> list[str]:
    """Queue names ``s0``, ``s1``, ... chosen so that ``per_shard`` of them hash to each of
    ``shards`` equal slot ranges (a queue lives in one slot: its keys share one hash tag)."""
    ranges = slot_ranges(shards)
    picked: list[list[str]] = [[] for _ in range(shards)]
    keys = Keys(prefix)
    i = 0
    while any(len(p) < per_shard for p in picked):
        name = f"s{i}"
        slot = key_slot(keys.queue(name).streams[0].encode())
        k = next(j for j, (lo, hi) in enumerate(ranges) if lo <= slot <= hi)
        if len(picked[k]) < per_shard:
            picked[k].append(name)
        i += 1
    return [q for p in picked for q in p]


def spread(queues: Sequence[str], shards: Shards, prefix: str) -> list[int]:
    """How many of ``queues`` each shard holds (a check for the report)."""
    keys = Keys(prefix)
    out = [0] * shards.n
    for q in queues:
        out[shards.node_of_slot(key_slot(keys.queue(q).streams[0].encode()))] += 1
    return out
