"""rq: sync jobs; concurrency = number of worker processes (``rq worker-pool -n C``).

rq has no in-process concurrency: each worker runs one job at a time, by
default forking a work horse per job. Variants: ``default`` = rq's default
Worker (fork per job), ``simple`` = SimpleWorker (runs jobs in the worker
process, no fork).
"""

from __future__ import annotations

import time
from typing import Sequence

import redis
from rq import Queue

from common import (
    CONFIG,
    NOOP,
    SLEEP,
    STAMP,
    WORKER_LOG_LEVEL,
    BenchConfig,
    Peer,
    incr_done,
    sync_stamp,
    venv_bin,
)


# rq's default Worker forks a work horse per job; a counting thread would die with it.
def noop() -> None:
    incr_done()


def stamp(enqueued_at: float) -> None:
    sync_stamp(enqueued_at)


def sleep(seconds: float) -> None:
    time.sleep(seconds)
    incr_done()


FUNCS = {NOOP: noop, STAMP: stamp, SLEEP: sleep}


class RqPeer(Peer):
    dist = "rq"
    bulk_api = "Queue.enqueue_many"

    def __init__(self, config: BenchConfig) -> None:
        super().__init__(config)
        self.conn = redis.Redis.from_url(config.redis_url)
        self.queue = Queue("bench", connection=self.conn)

    async def close(self) -> None:
        self.conn.close()

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            self.queue.enqueue(noop)
        else:
            self.queue.enqueue(FUNCS[kind], arg)

    async def enqueue_bulk(self, kind: str, args: Sequence[float]) -> None:
        fn = FUNCS[kind]
        datas = [Queue.prepare_data(fn, args=() if kind == NOOP else (a,)) for a in args]
        self.queue.enqueue_many(datas)

    @property
    def worker_class(self) -> str:
        return "rq.worker.SimpleWorker" if self.config.variant == "simple" else "rq.worker.Worker"

    def worker_commands(self, workload: str) -> list[list[str]]:
        argv = [
            venv_bin("rq"),
            "worker-pool",
            "--url",
            self.config.redis_url,
            "--worker-class",
            self.worker_class,
            "--num-workers",
            str(self.config.concurrency),
            "--logging-level",
            WORKER_LOG_LEVEL,
            "bench",
        ]
        return [argv for _ in range(self.config.procs)]

    def setting(self, workload: str) -> str:
        total = self.config.procs * self.config.concurrency
        return f"{total} worker processes (rq worker-pool -n {self.config.concurrency}), {self.worker_class}"


def make_peer(config: BenchConfig) -> Peer:
    return RqPeer(config)
