"""What a partitioned queue costs on one server: worker and Redis CPU per no-op task, and the
rate, for ``bulk`` with 1 partition and with 4 (3 interleaved rounds of 4,000 tasks; an
in-process worker, concurrency 16, on its own redis-server). The worker's CPU includes the
client's result reads in the same process.

    .venv/bin/python tools/bench_partitions.py

docs/operations.md ("Partitioned queues") quotes its figures.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from dtq import AsyncClient
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker
from tests.redis_server import free_port

N = 4000


def redis_cpu(r: Any) -> float:
    i = r.info("cpu")
    return float(i["used_cpu_user"] + i["used_cpu_sys"])


async def one(port: int, parts: int) -> tuple[float, float, float]:
    r = redis.Redis(port=port)
    s = make_settings(
        f"redis://127.0.0.1:{port}/0", "b" + secrets.token_hex(3), queues=("bulk",),
        queue_partitions={"bulk": parts}, worker_concurrency=16, heartbeat_interval_s=1.0,
        visibility_timeout_s=30,
    )  # fmt: skip
    async with AsyncClient(settings=s, app=app) as c:
        hs = await c.enqueue_many([{"name": "noop", "queue": "bulk"}] * N)
        c0, r0, t0 = time.process_time(), redis_cpu(r), time.monotonic()
        async with running_worker(app, s):
            for h in [*hs[:: N // 50], hs[-1]]:
                await c.result(h.id, timeout=120)
            c1, r1, t1 = time.process_time(), redis_cpu(r), time.monotonic()
    return (c1 - c0) / N * 1e6, (r1 - r0) / N * 1e6, N / (t1 - t0)


async def main(port: int) -> None:
    res: dict[int, list[tuple[float, float, float]]] = {1: [], 4: []}
    for _ in range(3):
        for p in (1, 4):
            res[p].append(await one(port, p))
    for p, rows in res.items():
        print(
            f"partitions={p}: worker µs/task {[round(x[0]) for x in rows]}, "
            f"Redis µs/task {[round(x[1]) for x in rows]}, tasks/s {[round(x[2]) for x in rows]}"
        )


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    port = free_port()
    srv = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    try:
        asyncio.run(main(port))
    finally:
        srv.kill()
