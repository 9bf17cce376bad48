"""Forming a Redis Cluster of private ``redis-server`` nodes on free ports: the one
implementation under the benchmark's shards (``bench/dtq_bench/shards.py``, workload S) and the
tests' cluster (``tests/redis_cluster.py``). Each starts its own node processes (the bench's
measure their CPU, the tests' are killed and restarted) and hands this module their ports.

It lives in ``tools/``, beside the checkout's other developer tools: not in the wheel (neither
``tools`` nor ``bench`` is a package of it; ``tests/ops/test_packaging.py``), and importable by
everything that runs from a checkout: pytest and ``python -m tests.chaos.run`` (the checkout is
on ``sys.path``), ``make bench`` (``python -m`` from the checkout) and ``dtq bench`` (which puts
the checkout on ``sys.path`` beside ``bench/``).

The nodes meet (``CLUSTER MEET``), the first ``masters`` split the 16,384 slots into equal ranges
(``CLUSTER ADDSLOTSRANGE``), each further node replicates master ``i % masters`` (``CLUSTER
REPLICATE``): what ``redis-cli --cluster create`` does, without needing ``redis-cli``.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Sequence
from typing import Any

import redis

SLOTS = 16384


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (and below 65536)."""
    while True:
        port = random.randint(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def node_args(node_timeout_ms: int) -> list[str]:
    """The ``redis-server`` options of a cluster node (its own ``nodes.conf`` in its dir)."""
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms),
    ]  # fmt: skip


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots of each of ``masters`` masters: equal ranges, in order."""
    return [(i * SLOTS // masters, (i + 1) * SLOTS // masters - 1) for i in range(masters)]


def _client(port: int) -> Any:  # redis-py's execute_command is untyped
    return redis.Redis(port=port, decode_responses=True, socket_timeout=5)


def form(ports: Sequence[int], masters: int, timeout: float = 30.0) -> None:
    """Make one cluster of the fresh nodes listening on ``ports``: the first ``masters`` hold
    the slots, each further node replicates master ``i % masters``. Returns before the cluster
    is ready: see :func:`wait_ready`."""
    clients = [_client(p) for p in ports]
    try:
        for p in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", p)
        for c, (lo, hi) in zip(clients[:masters], slot_ranges(masters), strict=True):
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        ids = [c.execute_command("CLUSTER", "MYID") for c in clients[:masters]]
        deadline = time.monotonic() + timeout
        for i, c in enumerate(clients[masters:]):
            while True:
                try:  # refused until the replica has heard of its master (gossip)
                    c.execute_command("CLUSTER", "REPLICATE", ids[i % masters])
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    finally:
        for c in clients:
            c.close()


def ready(ports: Sequence[int], known: int) -> bool:
    """Whether every node on ``ports`` says ``cluster_state:ok``, knows ``known`` nodes, and (a
    replica) is in sync with its master."""
    try:
        for p in ports:
            with _client(p) as c:
                text = c.execute_command("CLUSTER", "INFO")
                info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
                state = (info.get("cluster_state"), info.get("cluster_known_nodes"))
                if state != ("ok", str(known)):
                    return False
                repl = c.info("replication")
                if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                    return False
    except redis.RedisError:
        return False
    return True


def wait_ready(ports: Sequence[int], known: int, timeout: float, what: str) -> None:
    """Until :func:`ready`; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready(ports, known):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready")
        time.sleep(0.1)
