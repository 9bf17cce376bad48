"""What idle workers cost: CPU of the workers and of Redis, and the commands Redis runs, while
every queue is empty (docs/performance.md, "Idle workers and many queues").

    .venv/bin/python -m tools.idle_cost [--queues 50] [--workers 1] [--seconds 20] [ROOT ...]

For each checkout ROOT (default: this one; its ``libs`` and ``apps/worker`` go first on the
workers' path, as in tools/redis_script_ab.py), in turn: a private redis-server, ``--workers``
``python -m dtq_worker`` processes consuming ``--queues`` queues with the default settings
(heartbeat 5 s, visibility 30 s), a warm-up of 8 s (every scheduler lock taken, the first
retention pass over), then ``--seconds`` of measure: the workers' CPU (``/proc``), the server's
(``INFO cpu``) and its ``INFO commandstats`` per second (script calls and, counted inside them,
the commands they run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
WARM_S = 8.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(r: object) -> float:
    c = r.info("cpu")  # type: ignore[attr-defined]
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])


def measure(root: str, queues: int, workers: int, seconds: float) -> dict[str, object]:
    server = RedisServer().start()
    r = server.client()
    path = os.pathsep.join([f"{root}/libs", f"{root}/apps/worker", str(ROOT)])
    env = dict(
        os.environ, DTQ_REDIS_URL=server.url, DTQ_KEY_PREFIX="idle", PYTHONPATH=path,
        DTQ_QUEUES=",".join(f"q{i}" for i in range(queues)), DTQ_LOG_LEVEL="WARNING",
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dtq_worker", "tests.apps.basic:app", "--worker-id", f"w{i}"],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for i in range(workers)
    ]
    try:
        time.sleep(WARM_S)
        r.config_resetstat()
        w0, r0, t0 = sum(_cpu_s(p.pid) for p in procs), _redis_cpu(r), time.monotonic()
        time.sleep(seconds)
        w1, r1, dt = sum(_cpu_s(p.pid) for p in procs), _redis_cpu(r), time.monotonic() - t0
        stats = r.info("commandstats")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        server.stop()
    calls = {k.removeprefix("cmdstat_"): v["calls"] / dt for k, v in stats.items()}
    return {
        "worker_pct": 100 * (w1 - w0) / dt,
        "redis_pct": 100 * (r1 - r0) / dt,
        "calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="*", default=[str(ROOT)], help="checkout roots")
    ap.add_argument("--queues", type=int, default=50)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--all", action="store_true", help="every command, not the 8 most called")
    a = ap.parse_args()
    for root in a.roots:
        m = measure(root, a.queues, a.workers, a.seconds)
        calls: dict[str, float] = m["calls"]  # type: ignore[assignment]
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(calls.items())[: None if a.all else 8])
        print(
            f"{root}: {a.workers} worker(s), {a.queues} queues idle: workers "
            f"{m['worker_pct']:.2f}% of a core, Redis {m['redis_pct']:.2f}%; per second: {top}"
        )


if __name__ == "__main__":
    main()
