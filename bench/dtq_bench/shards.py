"""A private Redis Cluster of N masters (no replicas) for workload S, on free ports.

Each node is a :class:`~dtq_bench.server.BenchRedis` started with ``--cluster-enabled yes``;
the nodes meet and the 16,384 slots are split into N equal ranges (``CLUSTER ADDSLOTSRANGE``),
so a one-node "cluster" is built the same way as a three-node one and dtq talks to both through
``redis+cluster://``. No replicas: workload S measures the CPU a shard spends per task, and a
replica's share of it (applying the master's stream) is not dtq's choice to make.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Sequence

from redis.crc import key_slot

from dtq.keys import Keys
from dtq_bench.server import BenchRedis

SLOTS = 16384


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = random.randint(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


class Shards:
    """``with Shards(3) as c: c.url``; :meth:`flush` between runs, per-node CPU counters."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.nodes: list[BenchRedis] = []
        self.ranges = [(i * SLOTS // n, (i + 1) * SLOTS // n - 1) for i in range(n)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> Shards:
        try:
            for _ in range(self.n):
                node = BenchRedis(
                    port=_cluster_port(),
                    extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                "--cluster-node-timeout", "5000"),
                )  # fmt: skip
                self.nodes.append(node.start())
            first = self.nodes[0]
            with first.client() as c:
                for node in self.nodes[1:]:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            for node, (lo, hi) in zip(self.nodes, self.ranges, strict=True):
                with node.client() as c:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ok = 0
            for node in self.nodes:
                with node.client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                if "cluster_state:ok" in text and f"cluster_known_nodes:{self.n}" in text:
                    ok += 1
            if ok == self.n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bench cluster of {self.n} did not become ready")
            time.sleep(0.1)

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
    ranges = [(i * SLOTS // shards, (i + 1) * SLOTS // shards - 1) for i in range(shards)]
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
