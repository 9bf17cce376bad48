"""Run one benchmark workload against one peer task queue.

Usage (from the repo root, after bench/setup_peers.sh)::

    build/bench/peers-venv/bin/python bench/peers/run_peer.py --lib arq --workload A \
        --redis-url redis://127.0.0.1:6390/0 [--n N] [--concurrency C] [--procs P] \
        [--sleep-ms MS] [--interval-ms MS] [--variant V] [--timeout S]

The script re-executes itself with the right virtualenv's python when the
library lives in the other venv (arq and saq need redis-py < 6, see
bench/peers/README.md). It prints exactly one JSON object on the last line of
stdout. Workers are started as subprocesses with the library's own CLI, each
in its own process group, and are always killed at the end, on error and on
the hard timeout.

Workloads:
  A  no-op throughput: N tasks enqueued first (not timed), then workers start;
     seconds = worker start -> N tasks done.
  B  enqueue rate: N single enqueues, then N via the bulk call (if any); no worker.
  C  pickup latency: idle worker, N tasks enqueued --interval-ms apart; the task
     records time.time() - enqueue time.
  D  I/O-bound: N tasks each sleeping --sleep-ms, concurrency 100 by default.
  E  backlog: like A, with a large N chosen by the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

PEERS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PEERS_DIR.parent.parent
VENVS_DIR = REPO_ROOT / "build" / "bench"
LIBS = ("dramatiq", "taskiq", "arq", "saq", "streaq", "celery", "rq")
# arq pins redis-py < 6 and saq[redis] pins < 8 while taskiq-redis needs >= 8:
# these two live in a second venv (see bench/setup_peers.sh).
VENV_OF = {lib: "peers-venv" for lib in LIBS} | {"arq": "peers-venv-arq", "saq": "peers-venv-arq"}

WORKLOADS = ("A", "B", "C", "D", "E")
DEFAULT_N = {"A": 20000, "B": 20000, "C": 1000, "D": 5000, "E": 100000}
DEFAULT_CONCURRENCY = {"A": 32, "B": 32, "C": 32, "D": 100, "E": 32}
BULK_CHUNK = 1000
FILL_PARALLEL = 100
POLL_S = 0.002
WARMUP_IDLE_S = 2.0


def ensure_venv(lib: str) -> None:
    """Re-exec with the venv that has ``lib`` installed, if we are not in it."""
    venv = VENVS_DIR / VENV_OF[lib]
    python = venv / "bin" / "python"
    if Path(sys.prefix).resolve() == venv.resolve() or not python.exists():
        return
    if os.environ.get("BENCH_REEXEC") == "1":
        return  # already re-executed once; do not loop
    os.environ["BENCH_REEXEC"] = "1"
    sys.stdout.flush()
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------


class Workers:
    """Worker subprocesses, each the leader of its own process group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="dtq-bench-peer-"))
        self._lock = threading.Lock()
        # Put in every worker's environment: finds processes that left the
        # process group (rq's work horses call setpgrp()).
        self.run_id = uuid.uuid4().hex

    def start(self, argvs: Sequence[Sequence[str]], env: dict[str, str]) -> None:
        for i, argv in enumerate(argvs):
            log = open(self.logdir / f"worker{i}.log", "wb")
            proc = subprocess.Popen(
                list(argv),
                cwd=PEERS_DIR,
                env=env | {"BENCH_RUN_ID": self.run_id},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            with self._lock:
                self.procs.append(proc)

    def check_alive(self) -> None:
        for proc in self.procs:
            rc = proc.poll()
            if rc is not None:
                raise RuntimeError(f"worker {proc.args[0]} exited early with code {rc}")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process group, wait up to grace_s, then SIGKILL the groups."""
        with self._lock:
            procs, self.procs = self.procs, []
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            # Children of the leader (forked pools) are in the same group.
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for pid in self._tagged_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _tagged_pids(self) -> list[int]:
        """Pids of live processes whose environment carries this run's id."""
        tag = f"BENCH_RUN_ID={self.run_id}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if tag in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def log_tail(self, chars: int = 1500) -> str:
        text = ""
        for path in sorted(self.logdir.glob("*.log")):
            text += f"--- {path.name}\n" + path.read_text(errors="replace")[-chars:]
        return text[-3 * chars :]

    def cleanup(self) -> None:
        self.stop(grace_s=0.5)
        shutil.rmtree(self.logdir, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    peer: Any  # common.Peer
    redis: Any  # redis.Redis of the runner
    workers: Workers
    worker_env: dict[str, str]
    result: dict[str, Any] = field(default_factory=dict)

    def deadline_check(self) -> None:
        self.workers.check_alive()

    async def fill(self, kind: str, n: int, arg: float) -> tuple[float, str]:
        """Enqueue n tasks as fast as the library allows (bulk, else concurrent singles)."""
        t0 = time.perf_counter()
        if self.peer.bulk_api:
            for start in range(0, n, BULK_CHUNK):
                await self.peer.enqueue_bulk(kind, [arg] * min(BULK_CHUNK, n - start))
            how = f"bulk ({self.peer.bulk_api}, chunks of {BULK_CHUNK})"
        else:
            for start in range(0, n, FILL_PARALLEL):
                batch = min(FILL_PARALLEL, n - start)
                await asyncio.gather(*(self.peer.enqueue(kind, arg) for _ in range(batch)))
            how = "single enqueues"
        return time.perf_counter() - t0, how

    async def wait_until(
        self, n: int, *, use_list: bool, timeout_s: float
    ) -> tuple[float | None, float, int]:
        """Poll the done counter (or the latency list) until it reaches n.

        Returns (time of first completion, time of n-th completion, count), perf_counter clock.
        """
        first: float | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            count = int(self.redis.llen(LAT_KEY) if use_list else (self.redis.get(DONE_KEY) or 0))
            now = time.perf_counter()
            if count and first is None:
                first = now
            if count >= n:
                return first, now, count
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {count}/{n} tasks completed")
            self.workers.check_alive()
            await asyncio.sleep(POLL_S)

    def start_workers(self, workload: str) -> None:
        self.workers.start(self.peer.worker_commands(workload), self.worker_env)

    async def throughput(self, workload: str, kind: str, arg: float) -> None:
        n = self.args.n
        enqueue_s, how = await self.fill(kind, n, arg)
        t0 = time.perf_counter()
        self.start_workers(workload)
        first, end, count = await self.wait_until(n, use_list=False, timeout_s=self.args.timeout)
        self.workers.stop()
        seconds = end - t0
        self.result.update(
            tasks_per_s=round(n / seconds, 1),
            seconds=round(seconds, 3),
            # Rate once the first task had completed, i.e. without worker start-up time.
            steady_tasks_per_s=round((n - 1) / (end - first), 1) if first and end > first else None,
            startup_s=round(first - t0, 3) if first else None,
            completed=count,
            prefill_s=round(enqueue_s, 3),
            prefill=how,
            done_detection=f"task counts itself in-process; a thread INCRBYs {DONE_KEY} every 1 ms (rq: INCR per job); runner polls GET every {POLL_S * 1000:g} ms",
        )

    async def enqueue_rate(self) -> None:
        n = self.args.n
        t0 = time.perf_counter()
        for _ in range(n):
            await self.peer.enqueue(NOOP, 0.0)
        single = time.perf_counter() - t0
        self.redis.flushdb()
        bulk: float | None = None
        if self.peer.bulk_api:
            t0 = time.perf_counter()
            for start in range(0, n, BULK_CHUNK):
                await self.peer.enqueue_bulk(NOOP, [0.0] * min(BULK_CHUNK, n - start))
            bulk = time.perf_counter() - t0
            self.redis.flushdb()
        self.result.update(
            single_per_s=round(n / single, 1),
            single_seconds=round(single, 3),
            bulk_per_s=round(n / bulk, 1) if bulk else None,
            bulk_seconds=round(bulk, 3) if bulk else None,
            bulk_api=self.peer.bulk_api and f"{self.peer.bulk_api}, chunks of {BULK_CHUNK}",
        )

    async def pickup_latency(self) -> None:
        n = self.args.n
        interval = self.args.interval_ms / 1000.0
        self.start_workers("C")
        # Warm-up: wait until the worker has run one task, then let it go idle.
        await self.peer.enqueue(NOOP, 0.0)
        await self.wait_until(1, use_list=False, timeout_s=min(120.0, self.args.timeout))
        await asyncio.sleep(WARMUP_IDLE_S)
        self.redis.delete(DONE_KEY, LAT_KEY)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.peer.enqueue(STAMP, time.time())
        enqueue_s = time.perf_counter() - start
        await self.wait_until(n, use_list=True, timeout_s=self.args.timeout)
        self.workers.stop()
        from common import pct  # imported by main() once the venv is settled

        lat = sorted(float(x) for x in self.redis.lrange(LAT_KEY, 0, -1))
        self.result.update(
            p50_ms=pct(lat, 50),
            p95_ms=pct(lat, 95),
            p99_ms=pct(lat, 99),
            max_ms=round(lat[-1], 3),
            mean_ms=round(sum(lat) / len(lat), 3),
            interval_ms=self.args.interval_ms,
            enqueue_span_s=round(enqueue_s, 3),
            done_detection=f"task RPUSHes time.time()-enqueued_at to {LAT_KEY}; runner polls LLEN",
        )


# These are imported from common once the venv is settled.
DONE_KEY = LAT_KEY = NOOP = STAMP = SLEEP = ""


async def run_workload(run: Run) -> None:
    w = run.args.workload
    await run.peer.connect()
    try:
        if w in ("A", "E"):
            await run.throughput(w, NOOP, 0.0)
        elif w == "B":
            await run.enqueue_rate()
        elif w == "C":
            await run.pickup_latency()
        elif w == "D":
            await run.throughput(w, SLEEP, run.args.sleep_ms / 1000.0)
    finally:
        await run.peer.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lib", required=True, choices=LIBS)
    p.add_argument("--workload", required=True, choices=WORKLOADS)
    p.add_argument(
        "--redis-url", required=True, help="redis://127.0.0.1:PORT/DB (the DB is flushed!)"
    )
    p.add_argument("--n", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--sleep-ms", type=float, default=10.0)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument(
        "--variant", default="default", help="peer-specific alternative setting (see README)"
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="hard timeout of the whole run, seconds"
    )
    args = p.parse_args(argv)
    if args.n is None:
        args.n = DEFAULT_N[args.workload]
    if args.concurrency is None:
        args.concurrency = DEFAULT_CONCURRENCY[args.workload]
    return args


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_venv(args.lib)

    result: dict[str, Any] = {
        "lib": args.lib,
        "workload": args.workload,
        "n": args.n,
        "concurrency": args.concurrency,
        "procs": args.procs,
        "variant": args.variant,
    }
    workers = Workers()

    def on_timeout() -> None:
        workers.cleanup()
        emit(result | {"error": f"hard timeout after {args.timeout:g} s; workers killed"})
        os._exit(124)

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(f"terminated by signal {signum}")

    watchdog = threading.Timer(args.timeout, on_timeout)
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    rc = 0
    try:
        # common.CONFIG is read from the environment at import time, by this
        # process and by the worker CLIs alike: set it before importing.
        os.environ.update(
            BENCH_REDIS_URL=args.redis_url,
            BENCH_CONCURRENCY=str(args.concurrency),
            BENCH_PROCS=str(args.procs),
            BENCH_VARIANT=args.variant,
        )
        sys.path.insert(0, str(PEERS_DIR))
        import common

        config = common.CONFIG

        global DONE_KEY, LAT_KEY, NOOP, STAMP, SLEEP
        DONE_KEY, LAT_KEY = common.DONE_KEY, common.LAT_KEY
        NOOP, STAMP, SLEEP = common.NOOP, common.STAMP, common.SLEEP

        import redis

        r = redis.Redis.from_url(args.redis_url)
        r.flushdb()
        module = importlib.import_module(f"{args.lib}_peer")
        peer = module.make_peer(config)

        from importlib.metadata import version

        result.update(
            lib_version=version(peer.dist),
            redis_py_version=version("redis"),
            python=platform.python_version(),
            redis_server=r.info("server")["redis_version"],
            setting=peer.setting(args.workload),
            **peer.notes(),
        )
        env = dict(os.environ)
        env.update(config.to_env())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PEERS_DIR), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("BENCH_REEXEC", None)
        run = Run(args=args, peer=peer, redis=r, workers=workers, worker_env=env, result=result)
        if common.install_uvloop():
            result["runner_loop"] = "uvloop"
        asyncio.run(run_workload(run))
        r.flushdb()
    except BaseException as exc:  # noqa: BLE001 - report every failure as JSON
        result["error"] = f"{type(exc).__name__}: {exc}"
        tail = workers.log_tail()
        if tail:
            result["worker_log_tail"] = tail
        rc = 1
    finally:
        watchdog.cancel()
        workers.cleanup()
    emit(result)
    return rc


if __name__ == "__main__":
    sys.exit(main())
