"""Micro-benchmark of the worker's executor path (no Redis): ``Executor.execute`` of no-op
tasks, the outcome write answered at once. For the cost of middleware on the hot path:

    .venv/bin/python tools/bench_executor.py              # this checkout
    .venv/bin/python tools/bench_executor.py --mw noop    # with one no-op around_task
    .venv/bin/python tools/bench_executor.py --mw otel    # with tracing (spans not exported)
    PYTHONPATH=/work/main/libs:/work/main/apps/worker .venv/bin/python tools/bench_executor.py

Prints the best round's time per run, for an async and a sync task.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dtq import App
from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store.keys import Keys
from dtq_worker.env import WorkerEnv
from dtq_worker.executor import Executor
from dtq_worker.metrics import WorkerMetrics
from dtq_worker.runs import Run
from dtq_worker.slots import Slots


class _Scripts:
    """Progress reports are not sent (no task here reports any)."""

    async def run(self, call: Any, pipe: Any = None) -> Any:
        return None


class _Writer:
    async def write(self, outcome: Any, still_owned: Any) -> str:
        return "succeeded"


class NoOp:
    async def around_task(self, ctx: Any, call_next: Any) -> Any:
        return await call_next()


def make_executor(mw: str) -> Executor:
    app = App(Settings(redis_url="redis://127.0.0.1:1/0"))

    @app.task(name="anoop")
    async def anoop() -> None:
        return None

    @app.task(name="snoop")
    def snoop() -> None:
        return None

    if mw == "noop":
        app.add_middleware(NoOp())
    elif mw == "otel":  # the SDK's tracer, spans dropped (no processor): the middleware's cost
        from opentelemetry.sdk.trace import TracerProvider

        from dtq.contrib.otel import OpenTelemetryMiddleware

        app.add_middleware(OpenTelemetryMiddleware(tracer_provider=TracerProvider()))
    s = app.settings
    env = WorkerEnv(s, Keys(s.key_prefix), None, None, _Scripts(), WorkerMetrics("bench"))  # type: ignore[arg-type]
    slots = Slots(s.worker_concurrency, 0, {}, 60.0, lambda run: None)
    return Executor(env, app, ThreadPoolExecutor(4), _Writer(), slots, {})  # type: ignore[arg-type]


def claimed(name: str, i: int) -> sc.Claimed:
    return sc.Claimed(
        "default", f"t{i}", f"{i}-0", 2, name, "[]", "", 3, None, 0, 0, 0, 5, ""
    )  # fmt: skip


async def bench(ex: Executor, name: str, n: int, rounds: int) -> float:
    per: list[float] = []
    for r in range(rounds):
        runs = [Run(claimed(name, r * n + i)) for i in range(n)]
        t0 = time.perf_counter()
        for run in runs:
            await ex.execute(run)
        per.append((time.perf_counter() - t0) / n)
    return min(per)  # the least disturbed round: the machine may be shared


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mw", choices=["none", "noop", "otel"], default="none")
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    logging.disable(logging.INFO)  # DTQ_LOG_LEVEL=WARNING: the lifecycle lines are skipped
    ex = make_executor(a.mw)
    for name, n in (("anoop", a.n), ("snoop", a.n // 5)):
        await bench(ex, name, n // 5, 2)  # warm up
        us = await bench(ex, name, n, a.rounds) * 1e6
        print(f"{name}: {us:.2f} us per run (best of {a.rounds} rounds of {n})")


if __name__ == "__main__":
    asyncio.run(main())
