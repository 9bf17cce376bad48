"""celery (redis broker): ``celery worker --pool threads --concurrency C``.

Variants: ``default`` = thread pool with C threads (closest to "concurrency C");
``prefork`` = celery's default prefork pool with C child processes.
Gossip/mingle/heartbeat are disabled (recommended for throughput); no result backend.
"""

from __future__ import annotations

from celery import Celery

from common import (
    CONFIG,
    NOOP,
    SLEEP,
    STAMP,
    WORKER_LOG_LEVEL,
    BenchConfig,
    Peer,
    sync_noop,
    sync_sleep,
    sync_stamp,
    venv_bin,
)

app = Celery("celery_peer", broker=CONFIG.redis_url)
app.conf.update(
    task_default_queue="bench",
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop() -> None:
    sync_noop()


@app.task(name="stamp")
def stamp(enqueued_at: float) -> None:
    sync_stamp(enqueued_at)


@app.task(name="sleep")
def sleep(seconds: float) -> None:
    sync_sleep(seconds)


TASKS = {NOOP: noop, STAMP: stamp, SLEEP: sleep}


class CeleryPeer(Peer):
    dist = "celery"
    bulk_api = None  # group(...).apply_async() publishes message by message

    @property
    def pool(self) -> str:
        return "prefork" if self.config.variant == "prefork" else "threads"

    async def enqueue(self, kind: str, arg: float) -> None:
        if kind == NOOP:
            noop.delay()
        else:
            TASKS[kind].delay(arg)

    def worker_commands(self, workload: str) -> list[list[str]]:
        argv = [
            venv_bin("celery"),
            "-A",
            "celery_peer",
            "worker",
            "--pool",
            self.pool,
            "--concurrency",
            str(self.config.concurrency),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            WORKER_LOG_LEVEL,
            "-Q",
            "bench",
        ]
        return [argv + ["-n", f"bench{i}@%h"] for i in range(self.config.procs)]

    def setting(self, workload: str) -> str:
        unit = "threads" if self.pool == "threads" else "prefork processes"
        return (
            f"{self.config.procs} worker(s) x {self.config.concurrency} {unit} "
            f"(--pool {self.pool}); prefetch multiplier 4 (default)"
        )


def make_peer(config: BenchConfig) -> Peer:
    return CeleryPeer(config)
