"""What dtq's side of the benchmark and the peers' side (bench/peers) both use.

Imported by ``dtq_bench.tasks`` in dtq's virtualenv and by ``bench/peers/common.py`` and
``run_peer.py`` in the peers' virtualenvs, so it needs only the standard library and redis-py
(no dtq import, nothing newer than the oldest redis-py a peer pins).

* :data:`DONE_KEY` / :data:`LAT_KEY`: the counters every runner watches;
* :class:`DoneCounter`: a task counts itself done in-process and a thread adds the count to
  :data:`DONE_KEY` every millisecond, so a no-op costs no Redis round trip of its own;
* :func:`pct`: the percentile definition of every latency row.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence

import redis

DONE_KEY = "bench:done"
LAT_KEY = "bench:lat"
# Workload T (dtq only): one "<group> <enqueued at> <started at>" line per task of a new group.
FAIR_KEY = "bench:fair"


class DoneCounter:
    """Tasks finished in this process, added to :data:`DONE_KEY` by a thread every ``interval``.

    The thread starts with the first count in each process (a forked pool child starts its
    own). The runner sees a completion at most ``interval`` plus its own poll period late (a few
    ms in a run of seconds, the same for every library). ``url`` is called once, in the
    thread, so the caller's configuration is read in the process that counts.
    """

    def __init__(self, url: Callable[[], str], interval: float = 0.001) -> None:
        self.url = url
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
        r = redis.Redis.from_url(self.url())
        sent = 0
        while True:
            time.sleep(self.interval)
            n = self._n
            if n != sent:
                r.incrby(DONE_KEY, n - sent)
                sent = n


def pct(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence, rounded to 3 places."""
    idx = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return round(sorted_values[idx], 3)
