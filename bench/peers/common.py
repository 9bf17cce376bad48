"""Shared pieces of the peer benchmarks: configuration, keys and task bodies.

Every peer module (``<lib>_peer.py``) is imported twice: by ``run_peer.py``
(producer side) and by the library's own worker CLI (consumer side). Both read
their configuration from the ``BENCH_*`` environment variables that
``run_peer.py`` sets before importing the module or launching a worker.

The task bodies are identical for every library:

* ``noop``  -> nothing but counting itself done (:func:`done`),
* ``stamp`` -> one ``RPUSH`` of ``(time.time() - enqueued_at) * 1000`` to
  :data:`LAT_KEY` (pickup latency in ms, measured by the task itself),
* ``sleep`` -> sleep ``seconds`` (``asyncio.sleep`` or ``time.sleep``), then
  count itself done.

Counting done is ``dtq_bench.shared.DoneCounter`` (bench/dtq_bench/shared.py,
the one dtq's tasks use): an in-process integer that a daemon thread of the
worker process adds to :data:`DONE_KEY` every millisecond (``INCRBY``), so a
no-op task costs no Redis round trip of its own. rq forks a process per job by
default, whose threads die with it: its bodies ``INCR`` directly
(:func:`incr_done`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import redis
import redis.asyncio as aioredis

# bench/ on the path for dtq_bench.shared (stdlib + redis-py only; no dtq in this venv).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dtq_bench.shared import DONE_KEY, LAT_KEY, DoneCounter, pct  # noqa: E402

__all__ = ["DONE_KEY", "LAT_KEY", "pct"]

# Task kinds understood by every peer.
NOOP = "noop"
STAMP = "stamp"
SLEEP = "sleep"
KINDS = (NOOP, STAMP, SLEEP)


@dataclass(frozen=True)
class BenchConfig:
    redis_url: str
    concurrency: int
    procs: int
    variant: str

    @classmethod
    def from_env(cls) -> "BenchConfig":
        return cls(
            redis_url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6390/0"),
            concurrency=int(os.environ.get("BENCH_CONCURRENCY", "32")),
            procs=int(os.environ.get("BENCH_PROCS", "1")),
            variant=os.environ.get("BENCH_VARIANT", "default"),
        )

    def to_env(self) -> dict[str, str]:
        return {
            "BENCH_REDIS_URL": self.redis_url,
            "BENCH_CONCURRENCY": str(self.concurrency),
            "BENCH_PROCS": str(self.procs),
            "BENCH_VARIANT": self.variant,
        }


CONFIG = BenchConfig.from_env()


def install_uvloop() -> bool:
    """Make new asyncio event loops uvloop loops (for CLIs that create their own)."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


# --------------------------------------------------------------------------
# Task bodies, sync flavour (thread-safe; one connection pool per process).
# --------------------------------------------------------------------------

_sync_lock = threading.Lock()
_sync_client: redis.Redis | None = None
_sync_pid = 0


def sync_client() -> redis.Redis:
    global _sync_client, _sync_pid
    if _sync_client is None or _sync_pid != os.getpid():
        with _sync_lock:
            if _sync_client is None or _sync_pid != os.getpid():
                _sync_client = redis.Redis.from_url(CONFIG.redis_url)
                _sync_pid = os.getpid()
    return _sync_client


done = DoneCounter(lambda: CONFIG.redis_url).add


def incr_done() -> None:
    """One INCR per task (for libraries that fork a process per job)."""
    sync_client().incr(DONE_KEY)


def sync_noop() -> None:
    done()


def sync_stamp(enqueued_at: float) -> None:
    started = time.time()
    sync_client().rpush(LAT_KEY, (started - enqueued_at) * 1000.0)


def sync_sleep(seconds: float) -> None:
    time.sleep(seconds)
    done()


# --------------------------------------------------------------------------
# Task bodies, async flavour (one client per event loop).
# --------------------------------------------------------------------------

_async_clients: dict[int, aioredis.Redis] = {}


def async_client() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(id(loop))
    if client is None:
        client = aioredis.Redis.from_url(CONFIG.redis_url)
        _async_clients[id(loop)] = client
    return client


async def async_noop() -> None:
    done()


async def async_stamp(enqueued_at: float) -> None:
    started = time.time()
    await async_client().rpush(LAT_KEY, (started - enqueued_at) * 1000.0)


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
    done()


# --------------------------------------------------------------------------
# Producer-side interface implemented by each peer module.
# --------------------------------------------------------------------------


class Peer(ABC):
    """What run_peer.py needs from a library."""

    #: PyPI distribution name, used to report the version.
    dist: str
    #: The library's own bulk-enqueue call, or None if it has none.
    bulk_api: str | None = None

    def __init__(self, config: BenchConfig) -> None:
        self.config = config

    async def connect(self) -> None:
        """Open producer-side connections."""

    async def close(self) -> None:
        """Close producer-side connections."""

    @abstractmethod
    async def enqueue(self, kind: str, arg: float) -> None:
        """Enqueue one task of ``kind`` (``arg`` is ignored for noop)."""

    async def enqueue_bulk(self, kind: str, args: Sequence[float]) -> None:
        """Enqueue many tasks with the library's bulk call."""
        raise NotImplementedError

    @abstractmethod
    def worker_commands(self, workload: str) -> list[list[str]]:
        """argv of each worker process to start (run with cwd=bench/peers)."""

    @abstractmethod
    def setting(self, workload: str) -> str:
        """Human-readable description of the concurrency setting used."""

    def notes(self) -> dict[str, Any]:
        """Extra facts to put in the JSON result."""
        return {}


def venv_bin(name: str) -> str:
    """Path of a console script installed next to the running interpreter."""
    import sys
    from pathlib import Path

    return str(Path(sys.executable).parent / name)


#: Log level given to every worker CLI that logs each task at INFO by default;
#: per-task log lines are not what this benchmark measures.
WORKER_LOG_LEVEL = "WARNING"
