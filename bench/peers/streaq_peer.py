"""streaq (Redis Streams, coredis): ``streaq run streaq_peer:worker --workers P``, concurrency=C."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any, Sequence

from streaq import Worker

from common import (
    CONFIG,
    NOOP,
    SLEEP,
    STAMP,
    BenchConfig,
    Peer,
    async_noop,
    async_sleep,
    async_stamp,
    venv_bin,
)

worker: Worker[Any] = Worker(
    redis_url=CONFIG.redis_url,
    concurrency=CONFIG.concurrency,
    queue_name="bench",
    anyio_kwargs={"use_uvloop": True},
)


# silent=True: streaq logs every task start/finish at INFO by default.
@worker.task(silent=True)
async def noop() -> None:
    await async_noop()


@worker.task(silent=True)
async def stamp(enqueued_at: float) -> None:
    await async_stamp(enqueued_at)


@worker.task(silent=True)
async def sleep(seconds: float) -> None:
    await async_sleep(seconds)


TASKS: dict[str, Any] = {NOOP: noop, STAMP: stamp, SLEEP: sleep}


class StreaqPeer(Peer):
    dist = "streaq"
    bulk_api = "Worker.enqueue_many"

    def __init__(self, config: BenchConfig) -> None:
        super().__init__(config)
        self._stack = AsyncExitStack()

    async def connect(self) -> None:
        await self._stack.enter_async_context(worker)

    async def close(self) -> None:
        await self._stack.aclose()

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            await noop.enqueue()
        else:
            await TASKS[kind].enqueue(arg)

    async def enqueue_bulk(self, kind: str, args: Sequence[float]) -> None:
        fn = TASKS[kind]
        tasks = [fn.enqueue() for _ in args] if kind == NOOP else [fn.enqueue(a) for a in args]
        await worker.enqueue_many(tasks)

    def worker_commands(self, workload: str) -> list[list[str]]:
        return [
            [venv_bin("streaq"), "run", "streaq_peer:worker", "--workers", str(self.config.procs)]
        ]

    def setting(self, workload: str) -> str:
        return (
            f"{self.config.procs} process(es) x concurrency={self.config.concurrency} "
            f"(prefetch default = 2xC); uvloop"
        )

    def notes(self) -> dict[str, object]:
        from importlib.metadata import version

        return {"coredis_version": version("coredis")}


def make_peer(config: BenchConfig) -> Peer:
    return StreaqPeer(config)
