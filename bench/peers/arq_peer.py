"""arq: async jobs, one ``arq arq_peer.WorkerSettings`` process per --procs, max_jobs=C.

arq polls a sorted set every ``poll_delay`` seconds (default 0.5 s). Variants:
``default`` = poll_delay 0.01 s (a low poll delay, what a user tuning arq for
throughput/latency would set), ``stock`` = arq's default 0.5 s.
"""

from __future__ import annotations

from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from common import (
    CONFIG,
    NOOP,
    WORKER_LOG_LEVEL,
    BenchConfig,
    Peer,
    async_noop,
    async_sleep,
    async_stamp,
    install_uvloop,
    venv_bin,
)

# arq's Worker grabs asyncio.get_event_loop() when built, after this module is
# imported by the CLI, so this makes it run on uvloop.
install_uvloop()

FAST_POLL_DELAY = 0.01
STOCK_POLL_DELAY = 0.5
POLL_DELAY = STOCK_POLL_DELAY if CONFIG.variant == "stock" else FAST_POLL_DELAY


async def noop(ctx: dict[str, Any]) -> None:
    await async_noop()


async def stamp(ctx: dict[str, Any], enqueued_at: float) -> None:
    await async_stamp(enqueued_at)


async def sleep(ctx: dict[str, Any], seconds: float) -> None:
    await async_sleep(seconds)


class WorkerSettings:
    functions = [noop, stamp, sleep]
    redis_settings = RedisSettings.from_dsn(CONFIG.redis_url)
    max_jobs = CONFIG.concurrency
    poll_delay = POLL_DELAY


# Used via `arq --custom-log-dict arq_peer.LOG_CONFIG` (arq logs every job at INFO).
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"arq": {"handlers": ["console"], "level": WORKER_LOG_LEVEL}},
}


class ArqPeer(Peer):
    dist = "arq"
    bulk_api = None
    pool: ArqRedis

    async def connect(self) -> None:
        self.pool = await create_pool(RedisSettings.from_dsn(self.config.redis_url))

    async def close(self) -> None:
        await self.pool.aclose()

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            await self.pool.enqueue_job(kind)
        else:
            await self.pool.enqueue_job(kind, arg)

    def worker_commands(self, workload: str) -> list[list[str]]:
        argv = [
            venv_bin("arq"),
            "arq_peer.WorkerSettings",
            "--custom-log-dict",
            "arq_peer.LOG_CONFIG",
        ]
        return [argv for _ in range(self.config.procs)]

    def setting(self, workload: str) -> str:
        return (
            f"{self.config.procs} process(es) x max_jobs={self.config.concurrency}; "
            f"poll_delay={POLL_DELAY}s (arq default {STOCK_POLL_DELAY}s); uvloop"
        )


def make_peer(config: BenchConfig) -> Peer:
    return ArqPeer(config)
