"""taskiq + taskiq-redis: async tasks, ``taskiq worker --workers P --max-async-tasks C``.

Variants: ``default`` = RedisStreamBroker (Redis Streams + consumer group, acks;
the broker taskiq-redis recommends), ``list`` = ListQueueBroker (plain BRPOP,
no acknowledgement).
"""

from __future__ import annotations

from taskiq import AsyncBroker
from taskiq_redis import ListQueueBroker, RedisStreamBroker

from common import (
    CONFIG,
    NOOP,
    SLEEP,
    STAMP,
    WORKER_LOG_LEVEL,
    BenchConfig,
    Peer,
    async_noop,
    async_sleep,
    async_stamp,
    venv_bin,
)

broker: AsyncBroker
if CONFIG.variant == "list":
    broker = ListQueueBroker(url=CONFIG.redis_url, queue_name="bench")
else:
    broker = RedisStreamBroker(url=CONFIG.redis_url, queue_name="bench")


@broker.task(task_name="noop")
async def noop() -> None:
    await async_noop()


@broker.task(task_name="stamp")
async def stamp(enqueued_at: float) -> None:
    await async_stamp(enqueued_at)


@broker.task(task_name="sleep")
async def sleep(seconds: float) -> None:
    await async_sleep(seconds)


TASKS = {NOOP: noop, STAMP: stamp, SLEEP: sleep}


class TaskiqPeer(Peer):
    dist = "taskiq"
    bulk_api = None

    async def connect(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            await noop.kiq()
        else:
            await TASKS[kind].kiq(arg)

    def worker_commands(self, workload: str) -> list[list[str]]:
        # The taskiq CLI uses uvloop by itself when it is installed.
        return [
            [
                venv_bin("taskiq"),
                "worker",
                "taskiq_peer:broker",
                "--workers",
                str(self.config.procs),
                "--max-async-tasks",
                str(self.config.concurrency),
                "--log-level",
                WORKER_LOG_LEVEL,
            ]
        ]

    def setting(self, workload: str) -> str:
        kind = "ListQueueBroker" if self.config.variant == "list" else "RedisStreamBroker"
        return (
            f"{kind}; {self.config.procs} worker process(es) x --max-async-tasks "
            f"{self.config.concurrency}; uvloop"
        )

    def notes(self) -> dict[str, object]:
        from importlib.metadata import version

        return {"taskiq_redis_version": version("taskiq-redis")}


def make_peer(config: BenchConfig) -> Peer:
    return TaskiqPeer(config)
