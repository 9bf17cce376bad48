"""Redis time per task, command by command, of a real worker (docs/performance.md, "Redis time
per command"): a private redis-server, N no-op tasks bulk-enqueued with the SDK, then run to the
end by a real ``python -m dtq_worker``; each phase is read from the server's own counters.

    .venv/bin/python -m tools.redis_cmdstats                       # this checkout, 20,000 tasks
    .venv/bin/python -m tools.redis_cmdstats --python /work/wt/base/.venv/bin/python \\
        --python .venv/bin/python --rounds 5                      # two checkouts, interleaved

``--python`` names the interpreter of a checkout's venv (repeat it to compare checkouts; the runs
take turns, A B A B ..., so both meet the same load, and the medians are printed at the end).
The SDK enqueue and the worker run under that interpreter, so its checkout's code and scripts are
the ones measured; this tool only starts the server and reads it.

Per phase, from ``INFO commandstats`` (reset before each phase; commands a script calls are
counted there too, under their own names, as well as in the EVALSHA that called them):
calls per task and µs per task of each command, and the server's CPU (``used_cpu_sys +
used_cpu_user``) per task. "Lua between calls" is the EVALSHA time less every other command's:
the scripts' own work outside the commands they call (their Lua, and each redis.call's
conversion of arguments and reply), as long as the other commands were called by scripts (in
these phases all but a few heartbeat and idle-wait calls of the worker are). The run phase also
gives the worker's CPU per task and tasks/s. The tool's own polling (XLEN, SCAN, INFO, CONFIG)
is left out. Phases: ``bulk`` (parts of 1,000, as ``make bench``), ``run`` (worker start to the
last entry deleted: start-up included, under 1% at 20,000 tasks) and, with ``--single M``, M
single enqueues.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import redis

from tests.redis_server import RedisServer

PREFIX, QUEUE = "cs", "cs"
SCRIPTS = ("evalsha", "eval")
OWN = {"xlen", "scan", "info", "config|resetstat", "config", "ping", "client|setinfo", "hello"}
APP = """\
from dtq.app import App

app = App()


@app.task(name="bare")
async def bare() -> None:
    return None
"""
ENQUEUE = """\
import sys
from dtq import Client  # (its public home: older checkouts compare too)
from dtq.settings import Settings

mode, n = sys.argv[1], int(sys.argv[2])
c = Client(settings=Settings(redis_url=sys.argv[3], key_prefix=sys.argv[4], queues=(sys.argv[5],)))
item = {"name": "bare", "args": [], "queue": sys.argv[5]}
if mode == "bulk":
    for start in range(0, n, 1000):
        c.enqueue_many([item] * min(1000, n - start))
else:
    for _ in range(n):
        c.enqueue("bare", queue=sys.argv[5])
"""
Phase = dict[str, Any]


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _cmdstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) since the last reset, the tool's own commands left out."""
    out = {}
    for key, v in r.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name not in OWN:
            out[name] = (int(v["calls"]), int(v["usec"]))
    return out


def _queued(r: redis.Redis, streams: list[str]) -> int:
    with r.pipeline(transaction=False) as p:
        for s in streams:
            p.xlen(s)
        return sum(int(x) for x in p.execute())


def _streams(r: redis.Redis) -> list[str]:
    """The queue's priority streams, from the one an enqueue made (key names differ between
    versions)."""
    found = {k.decode().rsplit(":p", 1)[0] for k in r.scan_iter(match="*:p[0-9]", _type="stream")}
    if len(found) != 1:
        raise RuntimeError(f"expected the streams of one queue, found {found}")
    base = found.pop()
    return [f"{base}:p{band}" for band in range(10)]


def _measure(r: redis.Redis, n: int, work: Any) -> Phase:
    """Reset the counters, do ``work()`` (returns extra figures), read the counters."""
    r.config_resetstat()
    cpu0 = _cpu(r)
    extra = work()
    cpu = _cpu(r) - cpu0
    stats = _cmdstats(r)
    script = sum(u for c, (_, u) in stats.items() if c in SCRIPTS)
    calls = sum(u for c, (_, u) in stats.items() if c not in SCRIPTS)
    return {
        "n": n,
        "redis_cpu_us": cpu * 1e6 / n,
        "evalsha_us": script / n,
        "lua_us": (script - calls) / n,
        "cmds": {c: (calls / n, usec / n) for c, (calls, usec) in stats.items()},
        **extra,
    }


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_worker(
    r: redis.Redis, py: str, env: dict[str, str], n: int, log: Path, streams: list[str]
) -> Phase:
    """Start a worker on the n queued tasks; returns when every entry is gone (or raises)."""
    with open(log, "wb") as out:
        w = subprocess.Popen(
            [py, "-m", "dtq_worker", "cs_app:app"], env=env, stdout=out, stderr=out
        )
    try:
        t0 = time.perf_counter()
        deadline = time.monotonic() + 300
        while _queued(r, streams) > 0:
            if w.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker stopped or stuck:\n{log.read_text()[-2000:]}")
            time.sleep(0.005)
        secs = time.perf_counter() - t0
        wcpu = _proc_cpu(w.pid)
    finally:
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(15)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait(5)
    return {"tasks_per_s": n / secs, "worker_cpu_us": wcpu * 1e6 / n}


def one_round(py: str, n: int, single: int, concurrency: int, prefetch: int) -> dict[str, Phase]:
    """Every phase against a fresh private server, the code of interpreter ``py``."""
    tmp = Path(tempfile.mkdtemp(prefix="dtq-cmdstats-"))
    (tmp / "cs_app.py").write_text(APP)
    server = RedisServer().start()
    env = dict(os.environ)
    env.update(
        DTQ_REDIS_URL=server.url, DTQ_KEY_PREFIX=PREFIX, DTQ_QUEUES=QUEUE,
        DTQ_WORKER_CONCURRENCY=str(concurrency), DTQ_WORKER_PREFETCH=str(prefetch),
        DTQ_LOG_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp), env.get("PYTHONPATH")])),
    )  # fmt: skip

    def enqueue(mode: str, count: int) -> dict[str, Any]:
        argv = [py, "-c", ENQUEUE, mode, str(count), server.url, PREFIX, QUEUE]
        subprocess.run(argv, env=env, check=True)
        return {}

    phases: dict[str, Phase] = {}
    try:
        r = redis.Redis(port=server.port)
        enqueue("bulk", 10)  # loads the script and makes the queue's streams outside the measure
        streams = _streams(r)
        _run_worker(r, py, env, 10, tmp / "warm.log", streams)
        phases["bulk"] = _measure(r, n, lambda: enqueue("bulk", n))
        phases["run"] = _measure(r, n, lambda: _run_worker(r, py, env, n, tmp / "w.log", streams))
        if single:
            phases["single"] = _measure(r, single, lambda: enqueue("single", single))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # (with the __pycache__ the child may write)
    return phases


def _table(phase: str, p: Phase) -> str:
    lines = [f"{phase}: {p['n']:,} tasks  Redis CPU {p['redis_cpu_us']:.2f} us/task, EVALSHA "
             f"{p['evalsha_us']:.2f} us/task (Lua between calls {p['lua_us']:.2f})"]  # fmt: skip
    if "tasks_per_s" in p:
        lines[0] += f"  worker CPU {p['worker_cpu_us']:.1f} us/task  {p['tasks_per_s']:,.0f}/s"
    for c, (calls, us) in sorted(p["cmds"].items(), key=lambda kv: -kv[1][1]):
        if us >= 0.005 or calls >= 0.01:
            per = us / calls if calls else 0.0
            lines.append(f"  {c:<16} {calls:8.3f} calls/task {us:8.3f} us/task {per:7.3f} us/call")
    return "\n".join(lines)


KEYS = ("redis_cpu_us", "evalsha_us", "lua_us", "worker_cpu_us", "tasks_per_s")


def _medians(runs: list[dict[str, Phase]]) -> str:
    out = []
    for phase in runs[0]:
        vals = {k: [r[phase][k] for r in runs if k in r[phase]] for k in KEYS}
        out.append(f"  {phase:<7}" + "".join(
            f"  {k} {statistics.median(v):,.2f}" for k, v in vals.items() if v
        ))  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", help="a checkout's venv python (repeatable)")
    ap.add_argument("--n", type=int, default=20_000, help="no-op tasks per round")
    ap.add_argument("--single", type=int, default=0, help="single enqueues per round (0: none)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per interpreter, interleaved")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prefetch", type=int, default=16, help="as make bench: concurrency / 2")
    ap.add_argument("--json", help="write every round's figures to this file")
    a = ap.parse_args()
    pys = a.python or [sys.executable]
    results: dict[str, list[dict[str, Phase]]] = {py: [] for py in pys}
    for k in range(a.rounds):
        for py in pys:
            res = one_round(py, a.n, a.single, a.concurrency, a.prefetch)
            results[py].append(res)
            print(f"== round {k + 1}: {py}")
            print(textwrap.indent("\n".join(_table(ph, p) for ph, p in res.items()), "  "))
            sys.stdout.flush()
    if a.rounds > 1 or len(pys) > 1:
        print("== medians (us per task; tasks/s)")
        for py, runs in results.items():
            print(f"{py}\n{_medians(runs)}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
