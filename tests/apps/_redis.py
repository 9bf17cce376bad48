"""The test apps' own Redis client (one per URL and process: on a cluster, making a client
asks the cluster for its slot map, too slow to do once per task)."""

from __future__ import annotations

import functools
import os

import redis

from dtq.store.connection import sync_redis


@functools.cache
def _client(url: str, pid: int) -> redis.Redis:
    return sync_redis(url)


def shared_redis(url: str) -> redis.Redis:
    return _client(url, os.getpid())
