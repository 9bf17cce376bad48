"""dtq's side of workloads A-F, each measured against a private redis-server.

Every workload flushes the server first. Workers are real ``python -m dtq_worker`` processes;
the runner enqueues with the SDK and watches the same counters the peers' runner watches
(``bench:done`` / ``bench:lat``, see :mod:`dtq_bench.tasks`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import redis

from dtq.sdk.client import Client
from dtq.settings import Settings
from dtq.store.keys import Keys
from dtq_bench.server import BenchRedis
from dtq_bench.shared import DONE_KEY, LAT_KEY, pct

APP = "dtq_bench.tasks:app"
# On the workers' PYTHONPATH: the suite is not installed, it runs from the checkout's bench/.
BENCH_DIR = Path(__file__).resolve().parents[1]
PREFIX = "bench"
RAW_STREAM = "bench:raw-xadd"
QUEUE = "bench"
CHUNK = 1000
POLL_S = 0.002
Result = dict[str, Any]


class Workers:
    """dtq worker subprocesses; always stopped (SIGTERM, then SIGKILL) by :meth:`stop`.

    ``procs`` separate ``python -m dtq_worker`` processes, or with ``pool`` one
    ``dtq-worker --processes procs`` (a supervising parent and its children). ``url`` is where
    dtq's data lives, ``counter_url`` the server of the done counter (the same one unless the
    queue is on a cluster).
    """

    def __init__(
        self, url: str, concurrency: int, procs: int, log_level: str, *, pool: bool = False,
        counter_url: str | None = None, queues: Sequence[str] = (QUEUE,),
        prefetch: int | None = None,
    ) -> None:  # fmt: skip
        self.logdir = Path(tempfile.mkdtemp(prefix="dtq-bench-w-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        env = dict(os.environ)
        # Runs claimed ahead of free slots (DTQ_WORKER_PREFETCH, default 0 in dtq): half the
        # concurrency here, as the peers prefetch by default (dramatiq, celery), unless
        # ``prefetch`` says; reported in each row's setting. DTQ_WORKER_PREFETCH in the
        # environment overrides it.
        mine = concurrency // 2 if prefetch is None else prefetch
        self.prefetch = int(env.get("DTQ_WORKER_PREFETCH") or mine)
        how = f"--processes {procs}" if pool else f"{procs} process(es)"
        self.setting = (
            f"{how} x concurrency {concurrency}, prefetch {self.prefetch}; uvloop, hiredis"
        )
        env.update(
            DTQ_REDIS_URL=url,
            BENCH_REDIS_URL=counter_url or url,
            DTQ_KEY_PREFIX=PREFIX,
            DTQ_QUEUES=",".join(queues),
            DTQ_WORKER_CONCURRENCY=str(concurrency),
            DTQ_WORKER_PREFETCH=str(self.prefetch),
            DTQ_LOG_LEVEL=log_level,
            PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), env.get("PYTHONPATH")])),
        )
        env.pop("DTQ_WORKER_PROCESSES", None)
        self.env = env
        self.n = procs
        self.pool = pool

    def start(self) -> None:
        argvs = [[sys.executable, "-m", "dtq_worker", APP]]
        if self.pool:
            argvs[0] += ["--processes", str(self.n)]
        else:
            argvs *= self.n
        for i, argv in enumerate(argvs):
            with (self.logdir / f"worker{i}.log").open("wb") as fh:
                self.procs.append(
                    subprocess.Popen(
                        argv, env=self.env, stdin=subprocess.DEVNULL, stdout=fh,
                        stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip

    def check(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"dtq worker exited early ({p.returncode}):\n{self.tail()}")

    def pids(self) -> list[int]:
        """The worker processes and their descendants (a pool's children)."""
        return tree([p.pid for p in self.procs])

    def rss_kib(self) -> list[int]:
        """RSS of each worker process (a pool parent and each child apart)."""
        out = []
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out.append(int(line.split()[1]))
            except OSError:
                pass
        return out

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the worker processes (pool children included) used so
        far; a child that already exited is not counted (it is sampled before the stop)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                pass
        return total

    def tail(self, chars: int = 1500) -> str:
        return "".join(
            p.read_text(errors="replace")[-chars:] for p in sorted(self.logdir.glob("*.log"))
        )

    def log_lines(self) -> int:
        return sum(
            len(p.read_text(errors="replace").splitlines()) for p in self.logdir.glob("*.log")
        )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs = []

    def cleanup(self) -> None:
        self.stop()
        for p in self.logdir.glob("*"):
            p.unlink()
        self.logdir.rmdir()


def tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and every live descendant, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


class Store(Protocol):
    """Where dtq's data lives: the suite's redis-server, or a cluster (:mod:`dtq_bench.shards`)."""

    @property
    def url(self) -> str: ...

    def flush(self) -> None: ...

    def cpu_by_node(self) -> list[float]: ...


class DtqBench:
    """Runs one workload at a time against ``server``.

    ``data`` is where the queues live (default: ``server``); the done counters stay on
    ``server``, so a cluster's shards count only dtq's own work. Tasks are spread over
    ``queues`` in turn.
    """

    def __init__(
        self, server: BenchRedis, *, log_level: str = "WARNING", timeout: float = 600,
        data: Store | None = None, queues: Sequence[str] = (QUEUE,),
    ) -> None:  # fmt: skip
        self.server = server
        self.data: Store = data or server
        self.queues = tuple(queues)
        self.log_level = log_level
        self.timeout = timeout
        self.settings = Settings(redis_url=self.data.url, key_prefix=PREFIX, queues=self.queues)
        self.keys = Keys(PREFIX)

    def client(self) -> Client:
        return Client(settings=self.settings)

    def workers(
        self, concurrency: int, procs: int = 1, *, pool: bool = False,
        prefetch: int | None = None,
    ) -> Workers:  # fmt: skip
        return Workers(
            self.data.url, concurrency, procs, self.log_level, pool=pool,
            counter_url=self.server.url, queues=self.queues, prefetch=prefetch,
        )  # fmt: skip

    # --- helpers ---------------------------------------------------------------------------

    def flush(self) -> None:
        self.data.flush()
        if self.data is not self.server:
            self.server.flush()

    def redis_cpu(self) -> list[float]:
        """CPU seconds each node of ``data`` used so far (INFO cpu: used_cpu_user + _sys)."""
        return self.data.cpu_by_node()

    def fill(self, c: Client, name: str, n: int, args: list[Any] | None = None) -> float:
        """Bulk-enqueue ``n`` tasks in chunks (over the queues in turn); returns the seconds."""
        t0 = time.perf_counter()
        items = [{"name": name, "args": args or [], "queue": q} for q in self.queues]
        chunk = [items[i % len(items)] for i in range(CHUNK)]
        for start in range(0, n, CHUNK):
            c.enqueue_many(chunk[: min(CHUNK, n - start)])
        return time.perf_counter() - t0

    def wait_done(
        self, n: int, w: Workers, *, key: str = DONE_KEY, is_list: bool = False,
        mark: tuple[int, Callable[[int], None]] | None = None,
    ) -> tuple[float | None, float, list[int]]:  # fmt: skip
        """Poll the done counter until ``n``; returns (first done, n-th done, RSS samples).
        ``mark=(m, fn)``: ``fn(count)`` is called once, when the count first reaches ``m``."""
        first: float | None = None
        rss: list[int] = []
        next_rss = time.monotonic() + 0.5
        deadline = time.monotonic() + self.timeout
        with self.server.client() as r:
            while True:
                count = int(r.llen(key) if is_list else (r.get(key) or 0))
                now = time.perf_counter()
                if count and first is None:
                    first = now
                if mark is not None and count >= mark[0]:
                    mark[1](count)
                    mark = None
                if count >= n:
                    return first, now, rss
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {count}/{n} tasks completed:\n{w.tail()}")
                if time.monotonic() > next_rss:
                    rss.extend(w.rss_kib())
                    next_rss = time.monotonic() + 0.5
                w.check()
                time.sleep(POLL_S)

    def queued(self) -> int:
        """Entries left in the queue's streams (complete.lua deletes an entry when it ends)."""
        with self.server.client() as r, r.pipeline(transaction=False) as pipe:
            for s in self.keys.queue(QUEUE).streams:
                pipe.xlen(s)
            return sum(int(x) for x in pipe.execute())

    def wait_drained(self, left: int, w: Workers) -> tuple[float | None, float, list[int]]:
        """Like :meth:`wait_done` for ``bare`` tasks: until at most ``left`` entries remain."""
        first: float | None = None
        rss: list[int] = []
        start_len = self.queued()
        next_rss = time.monotonic() + 0.5
        deadline = time.monotonic() + self.timeout
        while True:
            q = self.queued()
            now = time.perf_counter()
            if q < start_len and first is None:
                first = now
            if q <= left:
                return first, now, rss
            if time.monotonic() > deadline:
                raise TimeoutError(f"{q} entries still queued:\n{w.tail()}")
            if time.monotonic() > next_rss:
                rss.extend(w.rss_kib())
                next_rss = time.monotonic() + 0.5
            w.check()
            time.sleep(POLL_S)

    # --- A / E: throughput -----------------------------------------------------------------

    def throughput(
        self, n: int, *, procs: int = 1, pool: bool = False, concurrency: int = 32,
        name: str = "noop", sleep_s: float | None = None, backlog: int = 0, flush: bool = True,
    ) -> Result:  # fmt: skip
        """``n`` tasks (plus ``backlog`` more behind them) queued, then worker start -> n done."""
        if flush:
            self.flush()
        args = [] if sleep_s is None else [sleep_s]
        with self.client() as c:
            cpu0 = sum(self.redis_cpu())
            prefill = self.fill(c, name, n + backlog, args)
            prefill_cpu = sum(self.redis_cpu()) - cpu0
        res = self.drain(
            n, procs=procs, pool=pool, concurrency=concurrency, name=name, backlog=backlog
        )
        res["prefill_s"] = round(prefill, 3)
        res["prefill_redis_cpu_us_per_task"] = round(prefill_cpu * 1e6 / (n + backlog), 2)
        return res

    def drain(
        self, n: int, *, procs: int = 1, pool: bool = False, concurrency: int = 32,
        name: str = "noop", backlog: int = 0,
    ) -> Result:  # fmt: skip
        """Start the workers on ``n`` queued tasks (plus ``backlog``) and time them to the n-th
        completion. CPU of the workers (pool children included) and of each Redis node, over
        the whole run and over its steady window: from the completion that reached 20% of
        ``n`` (every process started and warm) to the last, start-up costs left out."""
        with self.server.client() as r:
            r.delete(DONE_KEY)
        w = self.workers(concurrency, procs, pool=pool)
        redis_cpu0 = self.redis_cpu()
        at_mark: list[Any] = []

        def snap(count: int) -> None:
            at_mark.extend([time.perf_counter(), count, w.cpu_s(), self.redis_cpu()])

        try:
            t0 = time.perf_counter()
            w.start()
            if name == "bare":
                first, end, rss = self.wait_drained(backlog, w)
            else:
                first, end, rss = self.wait_done(n, w, mark=(max(1, n // 5), snap))
            worker_cpu = w.cpu_s()
            redis_cpu1 = self.redis_cpu()
        finally:
            w.stop()
            lines = w.log_lines()
            w.cleanup()
        secs = end - t0
        redis_cpu = [b - a for a, b in zip(redis_cpu0, redis_cpu1, strict=True)]
        res: Result = {
            "n": n,
            "setting": w.setting,
            "body": name,
            "procs": procs,
            "pool": pool,
            "concurrency": concurrency,
            "backlog": backlog,
            "tasks_per_s": round(n / secs, 1),
            "seconds": round(secs, 3),
            "steady_tasks_per_s": round((n - 1) / (end - first), 1)
            if first and end > first
            else None,
            "startup_s": round(first - t0, 3) if first else None,
            "worker_rss_mib": round(max(rss) / 1024, 1) if rss else None,
            "worker_cpu_us_per_task": round(worker_cpu * 1e6 / n, 1),
            "redis_cpu_us_per_task": round(sum(redis_cpu) * 1e6 / n, 1),
            "redis_cpu_us_per_task_by_node": [round(x * 1e6 / n, 2) for x in redis_cpu],
            "worker_log_lines": lines,
        }
        if at_mark and n > at_mark[1] and end > at_mark[0]:
            t_m, count_m, wcpu_m, rcpu_m = at_mark
            tasks, wall = n - count_m, end - t_m
            nodes = [b - a for a, b in zip(rcpu_m, redis_cpu1, strict=True)]
            res |= {
                "window_tasks": tasks,
                "window_tasks_per_s": round(tasks / wall, 1),
                "window_worker_cpu_us_per_task": round((worker_cpu - wcpu_m) * 1e6 / tasks, 1),
                "window_redis_cpu_us_per_task": round(sum(nodes) * 1e6 / tasks, 2),
                "window_redis_cpu_us_per_task_by_node": [round(x * 1e6 / tasks, 2) for x in nodes],
                "window_worker_cores": round((worker_cpu - wcpu_m) / wall, 3),
                "window_redis_cores_by_node": [round(x / wall, 3) for x in nodes],
            }
        return res

    # --- B: enqueue ------------------------------------------------------------------------

    def enqueue_rate(self, n: int, blocks: int = 40) -> Result:
        """Single enqueues, and the raw XADD loop of G interleaved with them in ``blocks``
        blocks each (G runs minutes earlier, when the machine may be faster or slower: the
        B-single target compares the two from here); then bulk.

        Short blocks, the two loops taking turns to go first: on a shared machine a burst of
        a neighbour's load lasts a fraction of a second, and the ratio of two long blocks read
        80-91% for the same code; this way both loops meet the same bursts."""
        self.flush()
        single = raw = 0.0
        with self.client() as c, redis.Redis.from_url(self.server.url) as r:
            c.enqueue("noop", queue=QUEUE)  # first call loads the script
            r.xadd(RAW_STREAM, {"t": "warm"})
            per = max(1, n // blocks)

            def dtq_block() -> float:
                t0 = time.perf_counter()
                for _ in range(per):
                    c.enqueue("noop", queue=QUEUE)
                return time.perf_counter() - t0

            def raw_block() -> float:
                t0 = time.perf_counter()
                for i in range(per):
                    r.xadd(RAW_STREAM, {"t": str(i)})  # as ceiling.xadd_single
                return time.perf_counter() - t0

            for b in range(blocks):
                if b % 2:
                    raw += raw_block()
                    single += dtq_block()
                else:
                    single += dtq_block()
                    raw += raw_block()
            self.server.flush()
            bulk = self.fill(c, "noop", n)
        self.server.flush()
        done = per * blocks
        return {
            "n": n,
            "single_per_s": round(done / single, 1),
            "raw_xadd_per_s": round(done / raw, 1),
            "bulk_per_s": round(n / bulk, 1),
            "bulk_api": f"Client.enqueue_many, chunks of {CHUNK}",
            "setting": f"Client.enqueue / Client.enqueue_many (chunks of {CHUNK:,})",
        }

    # --- C: pickup latency -----------------------------------------------------------------

    def pickup_latency(self, n: int, interval_ms: float = 5.0, warmup_s: float = 2.0) -> Result:
        self.server.flush()
        w = self.workers(32)
        try:
            w.start()
            with self.client() as c:
                c.enqueue("noop", queue=QUEUE)
                self.wait_done(1, w)
                time.sleep(warmup_s)
                interval = interval_ms / 1000
                start = time.perf_counter()
                for i in range(n):
                    delay = start + i * interval - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    c.enqueue("stamp", [time.time()], queue=QUEUE)
            self.wait_done(n, w, key=LAT_KEY, is_list=True)
        finally:
            w.cleanup()
        with self.server.client() as r:
            lat = sorted(float(x) for x in r.lrange(LAT_KEY, 0, -1))
        return {
            "n": n,
            "p50_ms": pct(lat, 50),
            "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99),
            "max_ms": round(lat[-1], 3),
            "interval_ms": interval_ms,
            "setting": w.setting,
        }

    # --- D: I/O-bound ----------------------------------------------------------------------

    def io_bound(self, n: int, concurrency: int = 100, sleep_ms: float = 10.0) -> Result:
        res = self.throughput(n, concurrency=concurrency, name="sleep", sleep_s=sleep_ms / 1000)
        ideal = concurrency / (sleep_ms / 1000)
        res["ideal_per_s"] = ideal
        res["of_ideal"] = round(res["tasks_per_s"] / ideal, 3)
        return res

    # --- E: backlog ------------------------------------------------------------------------

    def backlog(self, sizes: Sequence[int], n: int, runs: int) -> list[Result]:
        """One repetition of E: for each backlog size B in turn, fill B, then time ``runs`` runs
        of ``n`` tasks (each refilled behind the backlog) and keep the median run.

        The sizes follow each other within a repetition, so a machine that speeds up or slows
        down over the suite moves every size alike; the median of several runs per size keeps
        one slow run (a neighbour's burst on a shared machine) from deciding the ratio."""
        out = []
        for b in sizes:
            self.server.flush()
            with self.client() as c:
                fill_s = self.fill(c, "noop", b)
            timed = [self.throughput(n, backlog=0, flush=False) for _ in range(runs)]
            key = "steady_tasks_per_s"
            if not all(isinstance(r.get(key), int | float) for r in timed):
                key = "tasks_per_s"
            timed.sort(key=lambda r: float(r[key]))
            res = dict(timed[len(timed) // 2])
            res["backlog"] = b
            res["backlog_fill_s"] = round(fill_s, 1)
            res["queued_after"] = self.queued()
            res["runs_tasks_per_s"] = [r["tasks_per_s"] for r in timed]
            res["runs_steady_tasks_per_s"] = [r["steady_tasks_per_s"] for r in timed]
            out.append(res)
        return out

    # --- F: resources ----------------------------------------------------------------------

    def resources(self, n: int) -> Result:
        """Redis memory per queued task and per finished task kept; commands per task."""
        self.server.flush()
        with self.server.client() as r:
            # The streams and the group exist before the baseline (a worker made them).
            w = self.workers(32)
            try:
                w.start()
                with self.client() as c:
                    c.enqueue("bare", queue=QUEUE)
                    deadline = time.monotonic() + 60
                    while self.queued() and time.monotonic() < deadline:
                        time.sleep(0.05)
            finally:
                w.cleanup()
            r.delete(*r.keys(f"{PREFIX}:*:t:*"))
            r.delete(self.keys.queue(QUEUE).events)
            base = int(r.info("memory")["used_memory"])
            with self.client() as c:
                self.fill(c, "bare", n)
            queued_mem = int(r.info("memory")["used_memory"])
            r.config_resetstat()
            w = self.workers(32)
            polls = 0
            try:
                w.start()
                deadline = time.monotonic() + self.timeout
                while self.queued():
                    polls += 1
                    if time.monotonic() > deadline:
                        raise TimeoutError("F: tasks not finished")
                    w.check()
                    time.sleep(0.05)
                rss = w.rss_kib()
            finally:
                w.stop()
                w.cleanup()
            stats = r.info("commandstats")
            done_mem = int(r.info("memory")["used_memory"])
            events_len = int(r.xlen(self.keys.queue(QUEUE).events))
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        calls["xlen"] = calls.get("xlen", 0) - polls * 10
        calls["info"] = calls.get("info", 0) - 1
        total = sum(v for k, v in calls.items() if k not in ("info", "config|resetstat"))
        top = {k: round(v / n, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v > 0}
        return {
            "n": n,
            "bytes_per_queued_task": round((queued_mem - base) / n, 1),
            "bytes_per_finished_task_kept": round((done_mem - base) / n, 1),
            "events_stream_len": events_len,
            "worker_rss_mib": round(max(rss) / 1024, 1) if rss else None,
            "commands_per_task": round(total / n, 2),
            "script_calls_per_task": round((calls.get("evalsha", 0) + calls.get("eval", 0)) / n, 3),
            "commands_per_task_by_name": top,
        }
