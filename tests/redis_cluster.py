"""A private Redis Cluster for the tests: 3 masters with one replica each, on free ports.

Formed by ``tools/redis_cluster.py`` (shared with the benchmark's shards); ready once every
node says ``cluster_state:ok`` and knows every other node, and each replica has synced. Offers
what the tests need of it: its ``redis+cluster://`` URL, a client, the node that holds a key,
killing a master (its replica is promoted), a coordinated failover (``CLUSTER FAILOVER``),
restarting a replica, and moving a slot.
"""

from __future__ import annotations

import subprocess
import time

import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.redis_server import RedisServer
from tools.redis_cluster import cluster_port, form, node_args, ready

NODE_TIMEOUT_MS = 1000  # how long a master must be unreachable before its replica takes over


class RedisClusterFixture:
    def __init__(
        self, masters: int = 3, replicas: int = 1, replica_migration: bool = False
    ) -> None:
        """``replica_migration``: Redis's default, under which a master left without slots (or
        a replica whose master lost its last one) becomes a replica of the node that took
        them; off here, so an emptied master stays a master (``cluster-allow-replica-migration
        no``)."""
        self.masters, self.replicas = masters, replicas
        self.replica_migration = replica_migration
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def start(self) -> RedisClusterFixture:
        for _ in range(self.masters * (1 + self.replicas)):
            node = RedisServer(
                cluster_port(),
                extra_args=[
                    *node_args(NODE_TIMEOUT_MS),
                    "--cluster-require-full-coverage", "no",
                    "--cluster-allow-replica-migration",
                    "yes" if self.replica_migration else "no",
                ],
            )  # fmt: skip
            self.nodes.append(node.start())
        form([n.port for n in self.nodes], self.masters)
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says cluster_state:ok, knows the same nodes, and every
        master's replicas are synced."""
        deadline = time.monotonic() + timeout
        while True:
            if self._ok():
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not become ready")
            time.sleep(0.1)

    def _ok(self) -> bool:
        return ready([n.port for n in self.live_nodes()], len(self.nodes))

    def client(self) -> RedisCluster:
        return RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.live_nodes()],
            decode_responses=True,
        )

    def live_nodes(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def master_of(self, key: str) -> RedisServer:
        """The live node that serves ``key``'s slot (asked of the nodes themselves)."""
        for n in self.live_nodes():
            with n.client() as c:
                if c.info("replication").get("role") != "master":
                    continue
                slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                for lo, hi, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if lo <= slot <= hi:
                        return next(x for x in self.nodes if x.port == int(master[1]))
        raise RuntimeError(f"no live master serves {key!r}")

    def master_nodes(self) -> list[RedisServer]:
        out = []
        for n in self.live_nodes():
            with n.client() as c:
                if c.info("replication").get("role") == "master":
                    out.append(n)
        return out

    def begin_move(self, key: str, dst: RedisServer | None = None) -> SlotMove:
        """Start moving ``key``'s slot to ``dst`` (another master by default): the slot is
        MIGRATING on its owner and IMPORTING on ``dst``; :meth:`SlotMove.step` moves keys."""
        src = self.master_of(key)
        dst = dst or next(n for n in self.master_nodes() if n.port != src.port)
        return SlotMove(self, key, src, dst)

    def kill_master_of(self, key: str) -> RedisServer:
        """SIGKILL the master serving ``key``; returns it once its replica has taken over."""
        victim = self.master_of(key)
        victim.stop()
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.master_of(key).port != victim.port and self._ok():
                    return victim
            except (RuntimeError, redis.RedisError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("no replica took over")
            time.sleep(0.1)

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A live replica of ``master`` (as the master itself lists them)."""
        with master.client() as c:
            info = c.info("replication")
        ports = {int(v["port"]) for k, v in info.items() if k.startswith("slave")}
        for n in self.live_nodes():
            if n.port in ports:
                return n
        raise RuntimeError(f"{master.port} has no live replica")

    def failover(self, key: str, timeout: float = 60.0) -> tuple[RedisServer, RedisServer]:
        """A coordinated failover of ``key``'s master: ``CLUSTER FAILOVER`` sent to its
        replica, which waits until it has every write the master acknowledged (the master
        pauses its clients meanwhile), then takes over. Returns (old master, new master) once
        the cluster is settled again (the old master syncing as the new one's replica)."""
        old = self.master_of(key)
        new = self.replica_of(old)
        with new.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.master_of(key).port == new.port and self._ok():
                    return old, new
            except (RuntimeError, redis.RedisError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinated failover did not complete")
            time.sleep(0.05)

    def restart_replica(self, key: str, down_for: float = 0.0) -> RedisServer:
        """SIGKILL a replica of ``key``'s master and start it again (it resyncs in full);
        returns it once the cluster is settled."""
        node = self.replica_of(self.master_of(key))
        node.stop()
        time.sleep(down_for)
        node.start()
        self.wait_ok()
        return node

    def rejoin(self, node: RedisServer) -> None:
        """Start a killed node again: it comes back as a replica of its successor."""
        node.start()
        self.wait_ok()

    def node_id(self, node: RedisServer) -> str:
        with node.client() as c:
            return str(c.execute_command("CLUSTER", "MYID"))

    def rebalance(self, weights: dict[RedisServer, int], timeout: float = 300.0) -> str:
        """``redis-cli --cluster rebalance`` with these nodes' weights (0 moves every slot off
        a master); its output. AssertionError when it fails."""
        args = ["redis-cli", "--cluster", "rebalance", f"127.0.0.1:{self.nodes[0].port}"]
        for node, weight in weights.items():
            args += ["--cluster-weight", f"{self.node_id(node)}={weight}"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"redis-cli --cluster rebalance failed: {out[-2000:]}"
        return out

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()


class SlotMove:
    """A slot migration done by hand, as ``redis-cli --cluster reshard`` does it: SETSLOT
    IMPORTING/MIGRATING, MIGRATE of the keys a batch at a time, SETSLOT NODE everywhere."""

    def __init__(
        self, cluster: RedisClusterFixture, key: str, src: RedisServer, dst: RedisServer
    ) -> None:
        self.cluster, self.src, self.dst = cluster, src, dst
        self.s, self.d = src.client(), dst.client()
        self.slot = int(self.s.execute_command("CLUSTER", "KEYSLOT", key))
        self.src_id = self.s.execute_command("CLUSTER", "MYID")
        self.dst_id = self.d.execute_command("CLUSTER", "MYID")
        self.d.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.src_id)
        self.s.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.dst_id)

    def migrate(self, *keys: str) -> None:
        if keys:
            self.s.execute_command(
                "MIGRATE", "127.0.0.1", self.dst.port, "", 0, 5000, "KEYS", *keys
            )

    def step(self, batch: int = 10) -> int:
        """Move up to ``batch`` keys still on the source; how many moved."""
        keys = self.s.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
        self.migrate(*keys)
        return len(keys)

    def finish(self, batch: int = 10, pause_s: float = 0.0) -> None:
        """Move the rest (``pause_s`` between batches), then give the slot to the target."""
        while self.step(batch):
            time.sleep(pause_s)
        for c, node_id in ((self.d, self.dst_id), (self.s, self.dst_id)):
            c.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", node_id)
        for n in self.cluster.master_nodes():
            if n.port not in (self.src.port, self.dst.port):
                with n.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.dst_id)
        self.s.close()
        self.d.close()
