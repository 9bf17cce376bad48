"""Workload S: what a task costs Redis, and how throughput and CPU split over worker processes
and cluster shards (docs/performance.md, "Scale").

S keeps dtq's data on servers of its own, apart from the suite's redis-server, which holds only
the done counters: the Redis CPU figures are then dtq's alone (the counters' INCRBY every
millisecond and the runner's GET every 2 ms are not in them). Rows:

* ``cost``: Redis CPU per no-op task (``INFO cpu``: used_cpu_user + used_cpu_sys, deltas) for
  N single enqueues, then the run of those N tasks by one worker process (claim to completion,
  over the run's steady window), then N bulk enqueues and their run; with the network bytes
  per task (``INFO stats``) and the enqueuing client's own CPU; and N single enqueues made by
  :data:`COROUTINES` coroutines at once on one AsyncClient (coalesced: dtq/sdk/coalesce.py), their
  run costed as the run after the single enqueues; the same from :data:`THREADS` threads
  sharing one blocking Client (coalesced too: dtq/sdk/coalesce.py, SyncCoalescer); and the
  server's floor for one request:
  its CPU per ``PING`` sent one after another by one client, the least any request costs it
  (the read and write system calls, the wake-up from ``epoll_wait``), which a single enqueue
  pays before its script runs;
* ``server p1`` / ``server p2``: one redis-server, ``dtq-worker`` as one process and as
  ``--processes 2``;
* ``cluster1 p2`` / ``cluster3 p2``: a Redis Cluster of 1 and of 3 masters, ``--processes 2``,
  the tasks spread over 3 queues that hash to the 3 shards of the 3-master layout (one queue
  lives in one slot).

Every throughput row gives the CPU split over its steady window (from 20% of the tasks done to
the last; start-up left out): CPU µs per task and cores busy, for the workers and for each
Redis node.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from dtq import AsyncClient
from dtq_bench.server import BenchRedis
from dtq_bench.shards import Shards, queues_per_shard, spread
from dtq_bench.workloads import PREFIX, QUEUE, DtqBench, Store

Result = dict[str, Any]
ROWS = ("server p1", "server p2", "cluster1 p2", "cluster3 p2")
SHARDED_QUEUES = 3
COROUTINES = 64  # workload S's concurrent single enqueues: coroutines on one AsyncClient
THREADS = 64  # and threads sharing one blocking Client (a threaded web server's handlers)


def _net_bytes(store: Store) -> int:
    """Bytes in and out of every node so far (INFO stats)."""
    total = 0
    for url in _node_urls(store):
        with redis.Redis.from_url(url) as r:
            st = r.info("stats")
        total += int(st["total_net_input_bytes"]) + int(st["total_net_output_bytes"])
    return total


def _node_urls(store: Store) -> list[str]:
    if isinstance(store, Shards):
        return [n.url for n in store.nodes]
    return [store.url]


class ScaleBench:
    """The data servers of workload S, started once for all its repetitions."""

    def __init__(self, counters: BenchRedis, *, log_level: str = "WARNING") -> None:
        self.counters = counters
        self.log_level = log_level
        self.server = BenchRedis()
        self.c1 = Shards(1)
        self.c3 = Shards(3)

    def __enter__(self) -> ScaleBench:
        try:
            self.server.start()
            self.c1.start()
            self.c3.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.stop()
        self.c1.stop()
        self.c3.stop()

    def bench(self, data: Store, queues: tuple[str, ...] = (QUEUE,)) -> DtqBench:
        return DtqBench(self.counters, log_level=self.log_level, data=data, queues=queues)

    # --- rows ------------------------------------------------------------------------------

    def cost(self, n: int, *, cluster: bool = False) -> Result:
        """Redis CPU per no-op task: single and bulk enqueue, and each batch's run by one
        worker process; on the suite's own server, or (``cluster``) on the 3-master cluster
        with the tasks spread over its 3 queues."""
        if cluster:
            b = self.bench(self.c3, tuple(queues_per_shard(PREFIX, SHARDED_QUEUES)))
        else:
            b = self.bench(self.server)
        qs = b.queues
        out: dict[str, Result] = {}
        m: dict[str, dict[str, float]] = {}
        for how in ("single", "bulk"):
            b.flush()
            with b.client() as c:
                for q in qs:
                    c.enqueue("noop", queue=q)  # loads the script, registers the queue
                if how == "single":
                    m[how] = _measure(
                        b, lambda: [c.enqueue("noop", queue=qs[i % len(qs)]) for i in range(n)]
                    )
                else:
                    m[how] = _measure(b, lambda: b.fill(c, "noop", n))
            m["run_" + how] = _measure(b, functools.partial(_drain_into, b, n + len(qs), out, how))
        # Single enqueues from many coroutines at once (a web app's handlers) on one
        # AsyncClient, which sends those made while one is in flight as one call
        # (dtq/sdk/coalesce.py); their run costs what the run after the single enqueues does.
        b.flush()
        m["coalesced"] = asyncio.run(_from_coroutines(b, qs, n))
        b.flush()
        m["threaded"] = _from_threads(b, qs, n)
        b.flush()
        ping = _measure(b, functools.partial(_pings, b.data, n // 2))
        where = "3-master cluster, 3 queues" if cluster else "1 redis-server"
        per, per_run = 1e6 / n, 1e6 / (n + len(qs))
        res: Result = {"n": n, "setting": f"{where}; " + out["bulk"]["setting"]}
        for how in ("single", "bulk"):
            # The run's Redis CPU over its steady window (a worker's start-up is per worker,
            # not per task); the whole run's when the run was too short to have one.
            run_whole = m["run_" + how]["redis"] * per_run
            run = _num(out[how].get("window_redis_cpu_us_per_task")) or run_whole
            enq = m[how]["redis"] * per
            res |= {
                f"enqueue_{how}_redis_us": round(enq, 2),
                f"run_after_{how}_redis_us": round(run, 2),
                f"run_after_{how}_redis_us_whole_run": round(run_whole, 2),
                f"total_{how}_redis_us": round(enq + run, 2),
                f"enqueue_{how}_client_us": round(m[how]["client"] * per, 2),
                f"enqueue_{how}_net_bytes": round(m[how]["net"] / n, 1),
                f"run_after_{how}_net_bytes": round(m["run_" + how]["net"] / (n + len(qs)), 1),
                f"{how}_per_s": round(n / m[how]["wall"], 1),
                f"run_after_{how}_worker_cpu_us": out[how].get("window_worker_cpu_us_per_task"),
            }
        for how in ("coalesced", "threaded"):
            co = m[how]
            enq = co["redis"] * per
            res |= {
                f"enqueue_{how}_redis_us": round(enq, 2),
                f"total_{how}_redis_us": round(enq + res["run_after_single_redis_us"], 2),
                f"enqueue_{how}_client_us": round(co["client"] * per, 2),
                f"enqueue_{how}_net_bytes": round(co["net"] / n, 1),
                f"{how}_per_s": round(n / co["wall"], 1),
                f"{how}_calls_per_task": round(co["calls"] / n, 4),
            }
        res |= {
            "coroutines": COROUTINES,
            "threads": THREADS,
            "request_floor_redis_us": round(ping["redis"] * 1e6 / (n // 2), 2),
        }
        return res

    def row(self, name: str, n: int) -> Result:
        """One throughput row of :data:`ROWS`."""
        if name.startswith("server"):
            b = self.bench(self.server)
        else:
            shards = self.c1 if name.startswith("cluster1") else self.c3
            queues = tuple(queues_per_shard(PREFIX, SHARDED_QUEUES))
            b = self.bench(shards, queues)
        procs = int(name.rsplit("p", 1)[1])
        res = b.throughput(n, procs=procs, pool=procs > 1)
        res["queues"] = ",".join(b.queues)
        if isinstance(b.data, Shards):
            res["queues_per_node"] = "/".join(map(str, spread(b.queues, b.data, PREFIX)))
        b.flush()
        return res


async def _from_coroutines(b: DtqBench, qs: tuple[str, ...], n: int) -> dict[str, float]:
    """:func:`_measure`'s figures for ``n`` single enqueues made by :data:`COROUTINES`
    coroutines at once, each one after another, on one AsyncClient (the queues registered
    first, outside the measure)."""
    async with AsyncClient(settings=b.settings) as c:
        for q in qs:
            await c.enqueue("noop", queue=q)

        async def one(k: int) -> None:
            for i in range(k, n, COROUTINES):
                await c.enqueue("noop", queue=qs[i % len(qs)])

        start = _counters(b)
        await asyncio.gather(*(one(k) for k in range(COROUTINES)))
        return _since(b, start)


def _from_threads(b: DtqBench, qs: tuple[str, ...], n: int) -> dict[str, float]:
    """:func:`_measure`'s figures for ``n`` single enqueues made by :data:`THREADS` threads at
    once, each one after another, on one blocking Client (the client's CPU is the process's:
    all its threads)."""
    with b.client() as c:
        for q in qs:
            c.enqueue("noop", queue=q)

        def one(k: int) -> None:
            for i in range(k, n, THREADS):
                c.enqueue("noop", queue=qs[i % len(qs)])

        threads = [threading.Thread(target=one, args=(k,)) for k in range(THREADS)]
        start = _counters(b)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return _since(b, start)


def _pings(store: Store, n: int) -> None:
    """``n`` PINGs, one after another on one connection, to the first node."""
    with redis.Redis.from_url(_node_urls(store)[0]) as r:
        for _ in range(n):
            r.ping()


def _script_calls(store: Store) -> int:
    """EVALSHA and EVAL calls every node ran so far (INFO commandstats)."""
    total = 0
    for url in _node_urls(store):
        with redis.Redis.from_url(url) as r:
            st = r.info("commandstats")
        total += sum(int(st.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
    return total


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _drain_into(b: DtqBench, n: int, out: dict[str, Result], key: str) -> None:
    out[key] = b.drain(n)


def _measure(b: DtqBench, fn: Callable[[], object]) -> dict[str, float]:
    """Redis CPU (all nodes), client CPU, network bytes, wall time and script calls of ``fn``."""
    start = _counters(b)
    fn()
    return _since(b, start)


def _counters(b: DtqBench) -> tuple[float, int, float, float, int]:
    """What :func:`_since` subtracts: Redis CPU, network bytes, client CPU, clock, calls."""
    return (
        sum(b.redis_cpu()),
        _net_bytes(b.data),
        time.process_time(),
        time.perf_counter(),
        _script_calls(b.data),
    )


def _since(b: DtqBench, start: tuple[float, int, float, float, int]) -> dict[str, float]:
    r0, n0, c0, t0, calls0 = start
    wall, client = time.perf_counter() - t0, time.process_time() - c0
    return {
        "redis": sum(b.redis_cpu()) - r0,
        "net": _net_bytes(b.data) - n0,
        "client": client,
        "wall": wall,
        "calls": _script_calls(b.data) - calls0,
    }
