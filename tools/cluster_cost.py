"""What a task costs on a 3-master Redis Cluster against one redis-server, side by side.

``python -m tools.cluster_cost [--tasks N] [--singles N] [--reps R]``: one redis-server and a
3-master cluster (no replicas, ``bench/dtq_bench/shards.py``), one queue on each; per
repetition, interleaved: the client CPU of one-at-a-time enqueues (``time.process_time()``
over ``--singles`` calls of a blocking ``Client``), then ``--tasks`` bulk-enqueued no-op tasks
run by one worker process (worker and Redis CPU per task over the run's steady window, Redis
summed over the nodes: ``DtqBench.drain``). The cluster is measured with the fast lane on
(``cluster``) and off (``cluster-nolane``, redis-py's cluster command path: what dtq did before
the cluster had a lane), the server with it on. Prints each row and the medians' ratios to the
server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from dtq import Client
from dtq.settings import Settings
from dtq_bench.server import BenchRedis
from dtq_bench.shards import Shards, queues_per_shard
from dtq_bench.workloads import PREFIX, DtqBench


@contextlib.contextmanager
def lane(on: bool) -> Iterator[None]:
    """``DTQ_FAST_LANE`` for this process's clients and the workers it starts."""
    old = os.environ.get("DTQ_FAST_LANE")
    os.environ["DTQ_FAST_LANE"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DTQ_FAST_LANE", None)
        else:
            os.environ["DTQ_FAST_LANE"] = old


def singles(b: DtqBench, n: int) -> float:
    """Client CPU µs per one-at-a-time enqueue."""
    b.flush()
    with b.client() as c:
        for _ in range(200):  # connections, scripts, the slot map: not per call
            c.enqueue("noop", queue=b.queues[0])
        t0 = time.process_time()
        for _ in range(n):
            c.enqueue("noop", queue=b.queues[0])
        return (time.process_time() - t0) * 1e6 / n


def client_blocks(
    clients: dict[str, tuple[Client, str]], n: int, block: int = 250
) -> dict[str, float]:
    """Client CPU µs per one-at-a-time enqueue of each client (name: (client, queue)), measured
    in blocks of ``block`` calls taking turns, so a drift of the host's load is shared."""
    spent = dict.fromkeys(clients, 0.0)
    for c, q in clients.values():
        for _ in range(200):  # connections, scripts, the slot map: not per call
            c.enqueue("noop", queue=q)
    for _ in range(n // block):
        for name, (c, q) in clients.items():
            t0 = time.process_time()
            for _ in range(block):
                c.enqueue("noop", queue=q)
            spent[name] += time.process_time() - t0
    return {k: round(v * 1e6 / (n // block * block), 2) for k, v in spent.items()}


def _nodes(b: DtqBench) -> list[str]:
    return [n.url for n in b.data.nodes] if isinstance(b.data, Shards) else [b.data.url]


def _cmdstats(b: DtqBench) -> dict[str, int]:
    """Commands run so far, summed over the nodes, per command (INFO commandstats)."""
    out: dict[str, int] = {}
    for url in _nodes(b):
        with redis.Redis.from_url(url) as r:
            for k, v in r.info("commandstats").items():
                out[k] = out.get(k, 0) + int(v["calls"])
    return out


def row(b: DtqBench, tasks: int, n_single: int) -> dict[str, Any]:
    client = singles(b, n_single)
    b.flush()
    with b.client() as c:
        b.fill(c, "noop", tasks)
    c0 = _cmdstats(b)
    res = b.drain(tasks, procs=1)
    c1 = _cmdstats(b)
    calls = {
        k.removeprefix("cmdstat_"): round((v - c0.get(k, 0)) / tasks, 3) for k, v in c1.items()
    }
    return {
        "client_us": round(client, 2),
        "worker_us": res.get("window_worker_cpu_us_per_task"),
        "redis_us": res.get("window_redis_cpu_us_per_task"),
        "tasks_per_s": res.get("window_tasks_per_s"),
        "by_node": res.get("window_redis_cpu_us_per_task_by_node"),
        "calls": {k: v for k, v in calls.items() if v},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--singles", type=int, default=3_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default="server,cluster-nolane,cluster")
    a = ap.parse_args()
    names = a.rows.split(",")
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    with BenchRedis() as counters, BenchRedis() as server, Shards(3) as c3:
        q3 = queues_per_shard(PREFIX, 3)[0]
        clients = {
            "server": (
                Client(settings=Settings(redis_url=server.url, key_prefix=PREFIX)),
                "default",
            ),
            "cluster-nolane": (
                Client(settings=Settings(redis_url=c3.url, key_prefix=PREFIX, fast_lane=False)),
                q3,
            ),
            "cluster": (Client(settings=Settings(redis_url=c3.url, key_prefix=PREFIX)), q3),
        }
        print(
            "client CPU µs per single enqueue, blocks taking turns:",
            client_blocks({k: v for k, v in clients.items() if k in names}, a.singles * a.reps),
            flush=True,
        )
        for c, _ in clients.values():
            c.close()
        for rep in range(a.reps):
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                store: Any = server if name == "server" else c3
                queues = ("default",) if name == "server" else (q3,)
                with lane(name != "cluster-nolane"):
                    r = row(DtqBench(counters, data=store, queues=queues), a.tasks, a.singles)
                out[name].append(r)
                print(rep, name, r, flush=True)
    figures = ("client_us", "worker_us", "redis_us", "tasks_per_s")
    med = {k: {f: statistics.median(r[f] for r in v) for f in figures} for k, v in out.items()}
    for k, m in med.items():
        base = med.get("server")
        ratio = {f: round(m[f] / base[f], 2) for f in m} if base else {}
        print(f"median {k}: {m}  vs server: {ratio}")


if __name__ == "__main__":
    main()
