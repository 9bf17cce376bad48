"""saq: async jobs, ``saq saq_peer.settings --workers P`` with concurrency=C."""

from __future__ import annotations

from typing import Any

from saq import Queue

from common import (
    CONFIG,
    NOOP,
    BenchConfig,
    Peer,
    async_noop,
    async_sleep,
    async_stamp,
    install_uvloop,
    venv_bin,
)

# saq's CLI creates its loop with asyncio.new_event_loop() after importing this.
install_uvloop()

queue = Queue.from_url(CONFIG.redis_url, name="bench")


async def noop(ctx: dict[str, Any]) -> None:
    await async_noop()


async def stamp(ctx: dict[str, Any], *, enqueued_at: float) -> None:
    await async_stamp(enqueued_at)


async def sleep(ctx: dict[str, Any], *, seconds: float) -> None:
    await async_sleep(seconds)


settings: dict[str, Any] = {
    "queue": queue,
    "functions": [noop, stamp, sleep],
    "concurrency": CONFIG.concurrency,
}

ARG_NAME = {"stamp": "enqueued_at", "sleep": "seconds"}


class SaqPeer(Peer):
    dist = "saq"
    bulk_api = None  # Queue.map() enqueues one by one and then waits for results

    async def connect(self) -> None:
        await queue.connect()

    async def close(self) -> None:
        await queue.disconnect()

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            await queue.enqueue(kind)
        else:
            await queue.enqueue(kind, **{ARG_NAME[kind]: arg})

    def worker_commands(self, workload: str) -> list[list[str]]:
        # saq logs at ERROR level unless -v is given.
        return [[venv_bin("saq"), "saq_peer.settings", "--workers", str(self.config.procs)]]

    def setting(self, workload: str) -> str:
        return f"{self.config.procs} process(es) x concurrency={self.config.concurrency}; uvloop"


def make_peer(config: BenchConfig) -> Peer:
    return SaqPeer(config)
