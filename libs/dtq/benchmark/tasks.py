"""The benchmark's task functions, run by a real ``python -m dtq_worker dtq.benchmark.tasks:app``.

The bodies match the peers' (bench/peers/common.py) so every queue does the same work per task:
``noop`` only counts itself done, ``stamp`` RPUSHes its pickup latency in ms, ``sleep`` awaits
then counts itself done. Counting is an in-process integer; a thread of the worker process adds
it to ``bench:done`` every millisecond (:class:`DoneCounter`, the same as the peers'), so a no-op
costs no Redis round trip of its own. ``bare`` does nothing at all: completion is then read from
the queue itself (used where the benchmark wants only dtq's own Redis traffic, e.g. commands per
task).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import redis
import redis.asyncio as aredis

from dtq.app import App

DONE_KEY = "bench:done"
LAT_KEY = "bench:lat"

app = App()
_clients: dict[int, aredis.Redis] = {}


def _url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or app.settings.redis_url


def _client() -> aredis.Redis:
    loop = asyncio.get_running_loop()
    c = _clients.get(id(loop))
    if c is None:
        c = _clients[id(loop)] = aredis.Redis.from_url(_url())
    return c


class DoneCounter:
    """Tasks finished in this process, added to :data:`DONE_KEY` by a thread every ``interval``.

    The thread starts with the first count. The runner sees a completion at most ``interval``
    plus its own poll period late (a few ms in a run of seconds, the same for every library).
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._n = 0
        self._started = False
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._n, self._started = 0, False

    def add(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._report, name="bench-done", daemon=True).start()
            self._n += 1

    def _report(self) -> None:
        r = redis.Redis.from_url(_url())
        sent = 0
        while True:
            time.sleep(self.interval)
            n = self._n
            if n != sent:
                r.incrby(DONE_KEY, n - sent)
                sent = n


done = DoneCounter().add


@app.task(name="noop")
async def noop() -> None:
    done()


@app.task(name="bare")
async def bare() -> None:
    return None


@app.task(name="stamp")
async def stamp(enqueued_at: float) -> None:
    started = time.time()
    await _client().rpush(LAT_KEY, (started - enqueued_at) * 1000.0)


@app.task(name="sleep")
async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
    done()
