"""Cluster faults under load, with real worker processes: a busy queue's slot migrated to
another master, and its master replaced by its replica (a coordinated failover, and a kill).
Every attempt of every task starts once at most (body starts are recorded with RPUSH, which no
fault erases)."""

from __future__ import annotations

import collections
import signal
import threading
import time
from typing import Any

import pytest

from dtq import Client, TaskStatus
from dtq.store.keys import Keys
from tests.apt_tools import ensure_apt
from tests.conftest import body_starts, make_settings, wait_until
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow
APP = "tests.apps.basic:app"


def statuses(c: Client, ids: list[str]) -> list[str]:
    with c.redis.pipeline(transaction=False) as p:
        for i in ids:
            q, tid = i.split(":")
            p.hget(c.keys.queue(q).task(tid), "status")
        return [str(s) for s in p.execute()]


def test_a_busy_queue_slot_migrates_with_nothing_lost_or_started_twice(
    redis_cluster: RedisClusterFixture, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(redis_cluster.url, prefix, worker_concurrency=8)
    qk = Keys(prefix).queue("default")
    rc = redis_cluster.client()
    n, ids = 1200, []
    with Client(settings=s) as c:
        workers = [spawn_worker(APP, s, "--worker-id", f"w{i}") for i in range(2)]
        ids += [h.id for h in c.enqueue_many([{"name": "record", "args": [str(j)]}
                                             for j in range(n // 2)])]  # fmt: skip
        wait_until(lambda: len(body_starts(rc, prefix)) > 50, timeout=60)
        # The queue's slot moves, 10 keys at a time, while the workers claim and complete
        # and a client enqueues the second half.
        began = len(body_starts(rc, prefix))
        move = redis_cluster.begin_move(qk.streams[0])
        mover = threading.Thread(target=lambda: move.finish(batch=10, pause_s=0.01))
        mover.start()
        for k in range(n // 2, n, 50):
            ids += [h.id for h in c.enqueue_many([{"name": "record", "args": [str(j)]}
                                                 for j in range(k, k + 50)])]  # fmt: skip
        mover.join(120)
        assert not mover.is_alive()
        during = len(body_starts(rc, prefix)) - began
        assert during > 0 and began < n // 2, "the migration did not overlap the work"
        assert redis_cluster.master_of(qk.streams[0]).port == move.dst.port
        wait_until(lambda: all(x == "succeeded" for x in statuses(c, ids)), timeout=180,
                   interval=0.5)  # fmt: skip
        starts = body_starts(rc, prefix)
        twice = [p for p, k in collections.Counter((t, a) for t, a, _ in starts).items() if k > 1]
        assert not twice, f"started twice: {twice[:5]}"
        assert {t for t, _, _ in starts} == set(ids)  # none lost
        assert all(c.get(i).attempt == 1 for i in ids[:: n // 20])
        for w in workers:
            w.signal(signal.SIGTERM)
        assert [w.wait(60) for w in workers] == [0, 0]
    rc.close()


@pytest.mark.parametrize("how", ["coordinated", "kill"])
def test_a_master_fails_over_under_load_and_the_workers_carry_on(
    redis_cluster: RedisClusterFixture, prefix: str, spawn_worker: Any, how: str
) -> None:
    """The master serving a busy queue is replaced by its replica, under load.

    ``coordinated``: ``CLUSTER FAILOVER`` sent to the replica, which takes over only once it
    has every write the master acknowledged: nothing lost, nothing started twice.
    ``kill``: SIGKILL of the master; the replica takes over within the node timeout, workers
    and clients see transient errors and carry on, and every task the new master knows ends.
    With asynchronous replication the last writes the old master acknowledged may be gone
    (docs/operations.md): counted here, not asserted away."""
    keys = Keys(prefix)
    starts_master = redis_cluster.master_of(f"{prefix}:test:starts").port
    queue = next(
        q for q in (f"q{i}" for i in range(100))
        if redis_cluster.master_of(keys.queue(q).streams[0]).port != starts_master
    )  # fmt: skip
    qk = keys.queue(queue)
    # Leases and the heartbeat TTL outlast the failover (docs/operations.md), so a run in
    # flight is not taken back from its live worker: an extra start means a lost write.
    s = make_settings(redis_cluster.url, prefix, worker_concurrency=8, queues=[queue],
                      visibility_timeout_s=20)  # fmt: skip
    rc = redis_cluster.client()
    ids: list[str] = []
    victim = None
    try:
        with Client(settings=s) as c:
            workers = [spawn_worker(APP, s, "--worker-id", f"w{i}", "--queues", queue,
                                    DTQ_HEARTBEAT_TTL_S="10") for i in range(2)]  # fmt: skip
            batch = [{"name": "record", "args": [str(j), 0.1], "queue": queue} for j in range(400)]
            ids += [h.id for h in c.enqueue_many(batch)]
            wait_until(lambda: {w for _, _, w in body_starts(rc, prefix)} == {"w0", "w1"},
                       timeout=60)  # fmt: skip
            began = len(body_starts(rc, prefix))
            t0 = time.monotonic()
            if how == "kill":
                victim = redis_cluster.kill_master_of(qk.streams[0])
            else:
                redis_cluster.failover(qk.streams[0])
            took = time.monotonic() - t0
            ids += [h.id for h in c.enqueue_many(batch)]  # to the promoted replica
            known = [i for i, st in zip(ids, statuses(c, ids), strict=True) if st != "None"]
            try:
                wait_until(lambda: all(x == "succeeded" for x in statuses(c, known)),
                           timeout=120, interval=0.5)  # fmt: skip
            except AssertionError:
                left = collections.Counter(statuses(c, known))
                logs = "\n---\n".join(w.output()[-4000:] for w in workers)
                raise AssertionError(f"not all ended: {left}\n{logs}") from None
            starts = body_starts(rc, prefix)
            assert began < 400, "the failover did not overlap the work"
            twice = sum(k - 1 for k in collections.Counter(t for t, _, _ in starts).values())
            print(f"{how} failover in {took:.1f}s; tasks lost: {len(ids) - len(known)} of "
                  f"{len(ids)}; extra starts: {twice}")  # fmt: skip
            if how == "coordinated":
                assert (len(ids) - len(known), twice) == (0, 0)
                assert {t for t, _, _ in starts} == set(ids)
            dead = [w.output()[-3000:] for w in workers if w.proc.poll() is not None]
            assert not dead, f"a worker died in the failover: {dead[0]}"
            assert c.get(ids[-1]).status == TaskStatus.SUCCEEDED  # enqueued after: all fine
            for w in workers:
                w.signal(signal.SIGTERM)
            assert [w.wait(60) for w in workers] == [0, 0]
    finally:
        rc.close()
        if victim is not None:
            redis_cluster.rejoin(victim)


def keys_of(node: RedisServer) -> list[str]:
    """Every key ``node`` itself holds (asked of it directly: SCAN is keyless)."""
    with node.client() as c:
        return sorted(c.scan_iter(count=1000))


@pytest.mark.parametrize("replica_migration", [False, True], ids=["kept", "redis-default"])
def test_a_master_emptied_by_a_rebalance_under_load_keeps_no_key(
    prefix: str, spawn_worker: Any, replica_migration: bool
) -> None:
    """``redis-cli --cluster rebalance`` moves every slot off one master (weight 0) while two
    workers run six queues and a client enqueues: every task ends, each started once, and no
    key stays behind on the emptied master. Each key leaves with its slot (MIGRATE deletes it
    at the source), and nothing writes there once it served a slot no more: dtq's writes
    follow MOVED and ASK, and its scripts wait a migrating slot out (dtq.scripts.runner).

    ``kept``: the emptied master stays a master (``cluster-allow-replica-migration no``) and
    holds no key. ``redis-default``: Redis may make it a replica of the node that took its last
    slot (it did in every run here), and it then holds a copy of that node's keys, no other:
    a replica's, not keys left behind (docs/operations.md, "Redis Cluster and Sentinel").

    A private cluster: the session's keeps its three masters."""
    ensure_apt("redis-cli", "redis-tools")
    cluster = RedisClusterFixture(replica_migration=replica_migration).start()
    keys = Keys(prefix)
    queues = [f"q{i}" for i in range(6)]
    s = make_settings(cluster.url, prefix, worker_concurrency=8)
    rc = cluster.client()
    try:
        with Client(settings=s) as c:
            workers = [spawn_worker(APP, s, "--worker-id", f"w{i}", "--queues", ",".join(queues))
                       for i in range(2)]  # fmt: skip
            batch = [{"name": "record", "args": [str(j)], "queue": q}
                     for q in queues for j in range(100)]  # fmt: skip
            ids = [h.id for h in c.enqueue_many(batch)]
            wait_until(lambda: len(body_starts(rc, prefix)) > 50, timeout=60)
            victim = cluster.master_of(keys.queue(queues[0]).streams[0])
            assert keys_of(victim), "the master to empty holds no dtq key: nothing to move"
            began = len(body_starts(rc, prefix))
            feeder = threading.Thread(
                target=lambda: ids.extend(h.id for h in c.enqueue_many(batch))
            )
            feeder.start()
            cluster.rebalance({victim: 0})
            feeder.join(120)
            assert not feeder.is_alive()
            during = len(body_starts(rc, prefix)) - began
            assert during > 0 and began < len(ids) // 2, "the rebalance did not overlap the work"
            with victim.client() as v:
                role = v.info("replication")["role"]
                mine = [ln for ln in v.execute_command("CLUSTER", "NODES").splitlines()
                        if "myself" in ln]  # fmt: skip
            assert len(mine[0].split()) == 8, f"the emptied node still serves slots: {mine}"
            assert role == "master" or replica_migration, "the emptied master became a replica"
            if role == "master":
                assert keys_of(victim) == [], "keys left behind at once"
            wait_until(lambda: all(x == "succeeded" for x in statuses(c, ids)), timeout=180,
                       interval=0.5)  # fmt: skip
            starts = body_starts(rc, prefix)
            twice = [
                p for p, k in collections.Counter((t, a) for t, a, _ in starts).items() if k > 1
            ]
            assert not twice, f"started twice: {twice[:5]}"
            assert {t for t, _, _ in starts} == set(ids)  # none lost
            for w in workers:
                w.signal(signal.SIGTERM)
            assert [w.wait(60) for w in workers] == [0, 0]
        if role == "master":
            left = keys_of(victim)
            assert left == [], f"the emptied master keeps {len(left)} keys: {left[:10]}"
        else:
            with victim.client() as v:
                wait_until(lambda: v.info("replication")["master_link_status"] == "up", 60)
                port = int(v.info("replication")["master_port"])
            owner = next(n for n in cluster.nodes if n.port == port)
            theirs = keys_of(owner)
            with owner.client() as o:  # its replicas have every write it took
                n = int(o.info("replication")["connected_slaves"])
                assert o.execute_command("WAIT", n, 10000) == n
            left = keys_of(victim)
            assert left and not set(left) - set(theirs), "the replica holds keys its master lacks"
        print(f"the emptied node: a {role}, {len(left)} keys")
    finally:
        rc.close()
        cluster.cleanup()
