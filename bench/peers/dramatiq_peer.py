"""dramatiq (RedisBroker): sync actors run by ``dramatiq --processes P --threads C``."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from common import (
    CONFIG,
    NOOP,
    SLEEP,
    STAMP,
    BenchConfig,
    Peer,
    sync_noop,
    sync_sleep,
    sync_stamp,
    venv_bin,
)

broker = RedisBroker(url=CONFIG.redis_url)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench")
def noop() -> None:
    sync_noop()


@dramatiq.actor(queue_name="bench")
def stamp(enqueued_at: float) -> None:
    sync_stamp(enqueued_at)


@dramatiq.actor(queue_name="bench")
def sleep(seconds: float) -> None:
    sync_sleep(seconds)


ACTORS = {NOOP: noop, STAMP: stamp, SLEEP: sleep}


class DramatiqPeer(Peer):
    dist = "dramatiq"
    bulk_api = None  # group(...).run() sends message by message

    async def enqueue(self, kind: str, arg: float) -> None:
        actor = ACTORS[kind]
        if kind == NOOP:
            actor.send()
        else:
            actor.send(arg)

    def worker_commands(self, workload: str) -> list[list[str]]:
        return [
            [
                venv_bin("dramatiq"),
                "dramatiq_peer",
                "--processes",
                str(self.config.procs),
                "--threads",
                str(self.config.concurrency),
            ]
        ]

    def setting(self, workload: str) -> str:
        return f"{self.config.procs} process(es) x {self.config.concurrency} threads (--processes/--threads)"


def make_peer(config: BenchConfig) -> Peer:
    return DramatiqPeer(config)
