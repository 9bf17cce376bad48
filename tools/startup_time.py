"""A worker's start-up: time and CPU from launching ``dtq-worker`` to its first task's body,
and ``import dtq`` alone, for one or more checkouts, interleaved (docs/performance.md, "Start-up").

    .venv/bin/python -m tools.startup_time [--rounds 7] VENV_PYTHON [VENV_PYTHON ...]

Each round, for each checkout in turn: one task is enqueued (by that checkout's own client) to
a private redis-server, then ``python -m dtq_worker`` starts; the task's body writes the wall
time and the worker process's CPU time (``time.process_time()``: imports, settings, script
loading, the first claim) and the worker is stopped. CPU is the steadier figure on a shared
machine. ``import dtq`` is timed with ``-X importtime`` (its cumulative microseconds). Round 0
warms up and is not counted. Prints the median and the spread of each over the rounds.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.redis_server import RedisServer, free_port

APP = """
import time
from dtq import App

app = App()


@app.task(name="first")
def first(path: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"{time.time()} {time.process_time()}")
"""


# Bytecode is cached as an installed wheel's would be (PYTHONDONTWRITEBYTECODE=1 would make
# every start compile the checkout's sources: more source, more time, none of it a user's).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def import_us(python: str) -> int:
    err = subprocess.run(
        [python, "-X", "importtime", "-c", "import dtq"],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    ).stderr
    for line in err.splitlines():
        _, cumulative, name = line.split("|")
        if name == " dtq":  # the top level (nested imports are indented further)
            return int(cumulative)
    raise RuntimeError(f"no 'dtq' line in:\n{err}")


def first_task(python: str, url: str, appdir: str, n: int) -> tuple[float, float]:
    """Seconds of wall time and of worker CPU from the worker's launch to its first body."""
    out = Path(appdir) / f"first-{n}.txt"
    env = {**ENV, "PYTHONPATH": appdir, "DTQ_REDIS_URL": url, "DTQ_QUEUES": f"q{n}"}
    enqueue = (
        "import sys; from dtq import Client; from startup_app import app;"
        f"c = Client(app=app); c.enqueue('first', [sys.argv[1]], queue='q{n}'); c.close()"
    )
    subprocess.run([python, "-c", enqueue, str(out)], env=env, check=True)
    t0 = time.time()
    proc = subprocess.Popen(
        [python, "-m", "dtq_worker", "startup_app:app", "--concurrency", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{python}: the worker ran no task (exit {proc.poll()})")
            time.sleep(0.005)
        wall, cpu = (float(x) for x in out.read_text().split())
        return wall - t0, cpu
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summary(xs: list[float], unit: str, scale: float) -> str:
    m = statistics.median(xs) * scale
    return f"median {m:.1f} {unit} (min {min(xs) * scale:.1f}, max {max(xs) * scale:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pythons", nargs="+", help="each checkout's venv python")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    res: dict[str, dict[str, list[float]]] = {
        p: {"import": [], "wall": [], "cpu": []} for p in args.pythons
    }
    server = RedisServer(free_port()).start()
    try:
        with tempfile.TemporaryDirectory() as appdir:
            (Path(appdir) / "startup_app.py").write_text(APP)
            n = 0
            for r in range(args.rounds + 1):  # round 0 warms up (bytecode, page cache)
                for p in args.pythons:
                    n += 1
                    imp = import_us(p) / 1e6
                    wall, cpu = first_task(p, server.url, appdir, n)
                    if r:
                        res[p]["import"].append(imp)
                        res[p]["wall"].append(wall)
                        res[p]["cpu"].append(cpu)
    finally:
        server.stop()
    for p in args.pythons:
        r = res[p]
        print(p)
        print(f"  import dtq (-X importtime): {summary(r['import'], 'ms', 1e3)}")
        print(f"  launch to first body, wall: {summary(r['wall'], 'ms', 1e3)}")
        print(f"  worker CPU at first body:   {summary(r['cpu'], 'ms', 1e3)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
