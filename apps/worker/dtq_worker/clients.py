"""The worker's two Redis clients: one for its calls, one for its blocking reads."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aredis

from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store.connection import POOL_CONNECTIONS, async_redis, is_cluster_url


def worker_clients(settings: Settings, queues: int) -> tuple[aredis.Redis, aredis.Redis]:
    """``(calls, blocking)`` for a worker consuming ``queues`` (physical) queues: a call waits up
    to twice the heartbeat interval (at least 5 s); on a cluster the blocking reads hold two
    connections per queue (clusterwait.py, flowmover.py) beyond the pool's usual 100."""
    url, timeout = settings.redis_url, max(5.0, settings.heartbeat_interval_s * 2)
    both: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": min(timeout, 5.0)}
    calls = async_redis(url, socket_timeout=timeout, **both)
    if is_cluster_url(url):
        both["max_connections"] = POOL_CONNECTIONS + 2 * queues
    blocking = async_redis(url, socket_timeout=timeout + 2, **both)
    lane = settings.fast_lane
    sc.hiredis_packing(calls, fast_lane=lane)  # the batched script calls are long
    sc.hiredis_packing(blocking, fast_lane=lane)  # the idle XREAD names every band
    return calls, blocking
