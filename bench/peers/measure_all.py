"""Run every peer's workloads against a private redis-server and tabulate them.

Usage (from the repo root, after bench/setup_peers.sh; needs only the stdlib)::

    python3 bench/peers/measure_all.py [--libs arq,saq] [--workloads A,B,C,D] \
        [--variants] [--out build/bench/peers-results.jsonl]

Starts its own ``redis-server --port <free port> --save '' --appendonly no``,
runs ``run_peer.py`` once per (lib, workload) with the brief's parameters
(A: N=20000 C=32 P=1; B: N=20000; C: n=1000 at 5 ms; D: N=5000 C=100 sleep
10 ms), appends each JSON result to --out and prints a markdown table. The
redis-server is shut down on exit, error or signal.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

PEERS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PEERS_DIR.parent.parent
PYTHON = REPO_ROOT / "build" / "bench" / "peers-venv" / "bin" / "python"
LIBS = ["dramatiq", "taskiq", "arq", "saq", "streaq", "celery", "rq"]
WORKLOAD_ARGS: dict[str, list[str]] = {
    "A": ["--n", "20000", "--concurrency", "32", "--procs", "1"],
    "B": ["--n", "20000"],
    "C": ["--n", "1000", "--interval-ms", "5", "--concurrency", "32"],
    "D": ["--n", "5000", "--concurrency", "100", "--sleep-ms", "10"],
}
# Alternative settings worth knowing about, measured on workload A (and C).
VARIANTS: list[tuple[str, str, str]] = [
    ("arq", "stock", "A"), ("arq", "stock", "C"),
    ("taskiq", "list", "A"), ("taskiq", "list", "C"),
    ("celery", "prefork", "A"),
    ("rq", "simple", "A"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="dtq-bench-redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_one(redis: RedisServer, lib: str, workload: str, variant: str, timeout: float) -> dict[str, Any]:
    cmd = [str(PYTHON), str(PEERS_DIR / "run_peer.py"), "--lib", lib, "--workload", workload,
           "--redis-url", redis.url, "--variant", variant, "--timeout", str(timeout),
           *WORKLOAD_ARGS[workload]]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout + 60)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        result = {"lib": lib, "workload": workload, "variant": variant,
                  "error": f"no JSON (rc={proc.returncode}): {proc.stderr[-800:]}"}
    result["loadavg_1m_before"] = round(load_before, 2)
    return result


def plan(libs: list[str], workloads: list[str], variants: bool) -> Iterator[tuple[str, str, str]]:
    for lib in libs:
        for w in workloads:
            yield lib, w, "default"
    if variants:
        for lib, variant, w in VARIANTS:
            if lib in libs and w in workloads:
                yield lib, w, variant


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"
    return str(v)


def table(results: list[dict[str, Any]]) -> str:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        rows.setdefault((r["lib"], r.get("variant", "default")), {})[r["workload"]] = r
    out = ["| lib | variant | A tasks/s | A steady/s | B single/s | B bulk/s | C p50 ms | C p95 ms | C p99 ms | D tasks/s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (lib, variant), by_w in rows.items():
        def get(w: str, key: str) -> str:
            r = by_w.get(w)
            if r is None:
                return ""
            if "error" in r:
                return "error"
            return fmt(r.get(key))
        out.append(f"| {lib} | {variant} | {get('A', 'tasks_per_s')} | {get('A', 'steady_tasks_per_s')} | "
                   f"{get('B', 'single_per_s')} | {get('B', 'bulk_per_s')} | {get('C', 'p50_ms')} | "
                   f"{get('C', 'p95_ms')} | {get('C', 'p99_ms')} | {get('D', 'tasks_per_s')} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--libs", default=",".join(LIBS))
    p.add_argument("--workloads", default="A,B,C,D")
    p.add_argument("--variants", action="store_true", help="also run the alternative settings")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default=str(REPO_ROOT / "build" / "bench" / "peers-results.jsonl"))
    args = p.parse_args()
    if not PYTHON.exists():
        sys.exit("run bench/setup_peers.sh first")

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    redis = RedisServer()
    try:
        for lib, w, variant in plan(args.libs.split(","), args.workloads.split(","), args.variants):
            r = run_one(redis, lib, w, variant, args.timeout)
            results.append(r)
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            brief = {k: r.get(k) for k in ("lib", "workload", "variant", "tasks_per_s", "steady_tasks_per_s",
                                           "single_per_s", "bulk_per_s", "p50_ms", "p99_ms", "error")
                     if r.get(k) is not None}
            print(json.dumps(brief), file=sys.stderr, flush=True)
    finally:
        redis.stop()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
