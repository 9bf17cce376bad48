"""A fleet mid-upgrade, with real processes: workers of an older dtq (a commit of this repository,
checked out in a temporary worktree) and of this checkout on one private redis-server; the move
to schema 2 (docs/operations.md, "Upgrading a fleet") step by step:

1. an older worker makes the keyspace (schema 1); this checkout's client enqueues, and writes full
   records; the older worker runs every task;
2. a worker of this checkout joins: the keyspace stays at 1 while the older one lives; tasks
   enqueued meanwhile run (on both);
3. the older worker stops (SIGTERM): the keyspace moves to 2 when its heartbeat hash expired;
   records enqueued then leave their defaults out, and run;
4. an older worker started now refuses the keyspace (exit 2).

    .venv/bin/python -m tools.mixed_versions [COMMIT]   # default 77d5aa2: the last at schema 1

Needs git and the commit in this clone. Prints each step and exits 1 at the first that fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from dtq import Client, Settings
from dtq.keys import Keys, QueueKeys
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "mv"
HEARTBEAT_S = 0.5


def worker(code: Path, url: str, wid: str, log: Path) -> subprocess.Popen[bytes]:
    """A dtq-worker process of the checkout at ``code`` (its libs, apps and test apps)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=f"{code}/libs:{code}/apps/worker:{code}",
        DTQ_REDIS_URL=url, DTQ_KEY_PREFIX=PREFIX, DTQ_WORKER_ID=wid,
        DTQ_HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S), DTQ_VISIBILITY_TIMEOUT_S="5",
        DTQ_RETRY_BACKOFF_S="0.05", DTQ_RETRY_BACKOFF_MAX_S="0.2",
    )  # fmt: skip
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "dtq_worker", "tests.apps.basic:app"],
            cwd=code, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip


def wait(what: str, pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {what} (not within {timeout:.0f} s)")
        time.sleep(0.05)


def check(what: str, ok: bool) -> None:
    print(f"{'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        raise SystemExit(1)


def run_batch(c: Client, r: redis.Redis, n: int) -> tuple[int, bool]:
    """Enqueue n tasks (noop, and flaky: one failure, then success); wait for all; return how
    many succeeded and whether their records were written full (with intr etc.)."""
    hs = c.enqueue_many(
        [{"name": "noop"} if i % 2 else {"name": "flaky", "args": [1]} for i in range(n)]
    )
    queue, tid = hs[0].id.split(":", 1)
    full = r.hexists(QueueKeys(PREFIX, queue).task(tid), "intr")  # (no run writes it here)
    ok = 0
    for h in hs:
        c.result(h.id, timeout=60)
        ok += 1
    return ok, bool(full)


def main() -> None:
    commit = sys.argv[1] if len(sys.argv) > 1 else "77d5aa2"
    tmp = Path(tempfile.mkdtemp(prefix="dtq-mixed-"))
    old_code = tmp / "old"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old_code), commit],
                   cwd=ROOT, check=True)  # fmt: skip
    server = RedisServer().start()
    r = server.client()
    schema = Keys(PREFIX).schema
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = tmp / "workers.log"
        old = worker(old_code, server.url, "old-1", log)
        procs.append(old)
        wait("the older worker made the keyspace", lambda: r.get(schema) is not None)
        check(f"an older worker ({commit}) made the keyspace at schema 1", r.get(schema) == "1")
        settings = Settings(redis_url=server.url, key_prefix=PREFIX)
        with Client(settings=settings) as c:
            ok, full = run_batch(c, r, 200)
            check(f"this client wrote full records, the older worker ran them ({ok}/200)",
                  full and ok == 200)  # fmt: skip
            new = worker(ROOT, server.url, "new-1", log)
            procs.append(new)
            wait("the new worker beat", lambda: r.exists(Keys(PREFIX).worker("new-1")) == 1)
            time.sleep(6 * HEARTBEAT_S + 1)  # past the move's settle time, twice over
            check("with the older worker alive the keyspace stays at 1", r.get(schema) == "1")
            ok, full = run_batch(c, r, 200)
            check(f"tasks enqueued meanwhile are full records and run ({ok}/200)",
                  full and ok == 200)  # fmt: skip
            old.send_signal(signal.SIGTERM)
            check("the older worker drained and stopped (exit 0)", old.wait(30) == 0)
            wait("the move to schema 2", lambda: r.get(schema) == "2", timeout=60)
            check("the older worker gone, the keyspace moved to 2", True)
            time.sleep(0.1)
        with Client(settings=settings) as c:  # (a client's next registration reads it)
            ok, full = run_batch(c, r, 200)
            check(f"records now leave their defaults out, and run ({ok}/200)",
                  not full and ok == 200)  # fmt: skip
        again = worker(old_code, server.url, "old-2", log)
        procs.append(again)
        check("an older worker started now refuses the keyspace (exit 2)", again.wait(60) == 2)
        new.send_signal(signal.SIGTERM)
        check("the new worker drained and stopped (exit 0)", new.wait(30) == 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        server.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(old_code)], cwd=ROOT)
        print(f"worker logs: {tmp / 'workers.log'}")


if __name__ == "__main__":
    main()
