"""Redis-side cost of the claim per task, by how the tasks were enqueued (docs/performance.md,
"Declared defaults"). Starts its own redis-server; prints min and median over repetitions.

    .venv/bin/python -m tools.claim_cost [REPS]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

import redis

from dtq import scripts as sc
from dtq.sdk.requests import TaskDefaults, build_task
from dtq.settings import Settings
from dtq.store.keys import GROUP, Keys
from tests.redis_server import RedisServer

N, BATCH = 10_000, 16
KINDS: dict[str, tuple[TaskDefaults | None, str | None]] = {
    # kind: (the client's knowledge of the task, the declaration workers published)
    "known": (TaskDefaults(), None),
    "known+timeout+expires": (TaskDefaults(max_retries=1, timeout=2.5, expires=600), None),
    "by-name, undeclared": (None, None),
    "by-name, max_retries declared": (None, "1||"),
    "by-name, all three declared": (None, "1|2.5|600000"),
}


def claim_us_per_task(r: redis.Redis, st: Settings, kind: str, rep: int) -> float:
    known, decl = KINDS[kind]
    qk = Keys(st.key_prefix).queue(f"q{rep}-{abs(hash(kind))}")
    for stream in qk.streams:
        r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    if decl:
        r.hset(qk.decl, "t", decl)
    d = None if known is None else dataclasses.replace(known, queue=qk.queue)
    tasks = [build_task(st, "t", [1], defaults=d, queue=qk.queue)[1] for _ in range(N)]
    run = sc.SyncScripts(r).run
    for i in range(0, N, 250):
        run(sc.enqueue_call(qk, tasks[i : i + 250], 0))
    call = sc.claim_call(qk, "w", BATCH, 0, 60)
    got = len(sc.parse_claim(qk.queue, run(call)).runs)  # loads the script
    r.config_resetstat()
    while True:
        n = len(sc.parse_claim(qk.queue, run(call)).runs)
        if not n:
            break
        got += n
    stats = r.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / (got - BATCH)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    srv = RedisServer().start()
    try:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        st = Settings(redis_url=srv.url, key_prefix="cost")
        res: dict[str, list[float]] = {k: [] for k in KINDS}
        for rep in range(reps):  # interleaved, so a noisy moment hits every kind alike
            for kind in KINDS:
                res[kind].append(claim_us_per_task(r, st, kind, rep))
        for kind, xs in res.items():
            print(f"{kind:32} min {min(xs):5.2f}  median {statistics.median(xs):5.2f} us/task")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
