"""Redis connections from ``DTQ_REDIS_URL``: plain, TLS, unix socket, Sentinel or Cluster (the
URL forms: docs/configuration.md). A cluster client is typed as the plain one it stands in for:
dtq calls only commands both have, and the few places that need a connection of their own (the
fast lane per node, dtq.store.cluster; the idle wake-up) ask :func:`is_cluster` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import ParseResult, parse_qs, unquote, urlparse

import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
import redis.cluster as scluster
import redis.exceptions as rex
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel
from redis.sentinel import SentinelConnectionPool as SyncSentinelPool

from dtq.errors import EvictingRedis
from dtq.store.eviction import check_connection, check_pool, checking
from dtq.store.inflight import AsyncInFlight, SyncInFlight, no_cap
from dtq.store.transport import MAX_ASYNC_LANES

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    hosts: list[tuple[str, int]]
    service: str
    db: int
    password: str | None
    username: str | None


def _hosts(parsed: ParseResult, what: str) -> list[tuple[str, int]]:
    """The ``host:port[,host:port...]`` list of a multi-host URL."""
    hosts = []
    for part in parsed.netloc.rpartition("@")[2].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{what} address {part!r} must be host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _credentials(parsed: ParseResult) -> tuple[str | None, str | None]:
    """(password, username) of a URL, unquoted."""
    return (
        unquote(parsed.password) if parsed.password else None,
        unquote(parsed.username) if parsed.username else None,
    )


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Split a ``redis+sentinel://`` URL; raise ValueError saying what is wrong."""
    parsed = urlparse(url)
    if parsed.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    hosts = _hosts(parsed, "sentinel")
    path = [p for p in parsed.path.split("/") if p]
    if not path:
        raise ValueError("names no service: redis+sentinel://host:port/<service>[/db]")
    db = path[1] if len(path) > 1 else "0"
    if not db.isdigit():
        raise ValueError(f"bad database number {db!r}")
    return SentinelUrl(hosts, path[0], int(db), *_credentials(parsed))


# The query options a cluster URL takes (TLS files and checks), passed to redis-py as given.
CLUSTER_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    nodes: list[tuple[str, int]]
    password: str | None
    username: str | None
    ssl: bool
    options: dict[str, str]


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterUrl:
    """Split a ``redis+cluster://`` URL; raise ValueError saying what is wrong."""
    parsed = urlparse(url)
    if parsed.scheme not in CLUSTER_SCHEMES:
        raise ValueError("not a redis+cluster:// or rediss+cluster:// URL")
    nodes = _hosts(parsed, "cluster node")
    if parsed.path.strip("/"):
        raise ValueError("a cluster has one database: nothing may follow host:port[,...]/")
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    unknown = sorted(set(options) - set(CLUSTER_OPTIONS))
    if unknown:
        raise ValueError(
            f"bad option: {unknown[0]!r} (a cluster URL takes {', '.join(CLUSTER_OPTIONS)})"
        )
    password, username = _credentials(parsed)
    return ClusterUrl(nodes, password, username, parsed.scheme == "rediss+cluster", options)


def is_cluster(client: object) -> bool:
    """Whether ``client`` (from :func:`sync_redis` / :func:`async_redis`) talks to a cluster:
    the one question code that would write to a connection of its own asks."""
    return isinstance(client, scluster.RedisCluster | acluster.RedisCluster)


# redis-py's "no startup node reachable" is a RedisClusterException, outside the RedisError
# family every dtq caller handles: raised here as the ConnectionError it is.
_UNREACHABLE = "Redis Cluster cannot be connected"
# How long a command waits out a migrating slot: TRYAGAIN means it did not run, so re-sending
# is safe; redis-py's own retry covers only about half a second.
SLOT_WAIT_S = 10.0


def _as_connection_error(exc: redis.RedisClusterException) -> Exception:
    if isinstance(exc.__cause__, EvictingRedis):  # every node refused: say why, as one server does
        return exc.__cause__
    if _UNREACHABLE in str(exc):
        return redis.ConnectionError(str(exc))
    return exc


def _slot_in_flux(exc: Exception) -> bool:
    """The command did not run: its slot is migrating (TRYAGAIN, or redis-py's redirects ran
    out while it followed the migration)."""
    return isinstance(exc, rex.TryAgainError) or (
        isinstance(exc, rex.ClusterError) and "TTL exhausted" in str(exc)
    )


class _SlotWait:
    """Backoff over :data:`SLOT_WAIT_S` for a command whose slot is migrating."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + SLOT_WAIT_S
        self.delay = 0.02

    def next(self, exc: Exception) -> float:
        """The pause before the next try; raises ``exc`` when out of time or not in flux."""
        if not _slot_in_flux(exc) or time.monotonic() >= self.deadline:
            raise exc
        delay, self.delay = self.delay, min(self.delay * 2, 0.5)
        return delay


POOL_CONNECTIONS = 100  # a client's connections at most (redis-py's default pool too)
POOL_WAIT_S = 20.0  # how long a call waits for one of them before RedisUnavailable
# A node's pool also holds, outside the POOL_CONNECTIONS places calls wait for: the result()
# subscription (one, and one being remade) and the fast lane's kept connections.
SUBSCRIBED_ROOM = 4
LANE_ROOM = MAX_ASYNC_LANES


def _node_pool(kwargs: dict[str, Any], wait_for_connection: bool) -> dict[str, Any]:
    if wait_for_connection:
        return {"max_connections": POOL_CONNECTIONS + SUBSCRIBED_ROOM + LANE_ROOM, **kwargs}
    return kwargs


class _SyncCluster(scluster.RedisCluster):
    def __init__(
        self, *, wait_for_connection: bool = False, check_eviction: bool = False, **kwargs: Any
    ) -> None:
        # As _AsyncCluster's; set first: the constructor reads the slot map through
        # execute_command.
        self._gate: Callable[[], contextlib.AbstractContextManager[None]] = (
            SyncInFlight(POOL_CONNECTIONS) if wait_for_connection else no_cap
        )
        if check_eviction:  # (a connection class is not passed through by every redis-py 8)
            kwargs = {**kwargs, "redis_connect_func": check_connection}
        try:
            super().__init__(**_node_pool(kwargs, wait_for_connection))
        except redis.RedisClusterException as exc:
            raise _as_connection_error(exc) from None

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        wait: _SlotWait | None = None
        while True:
            try:
                with self._gate():
                    return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except redis.RedisClusterException as exc:
                raise _as_connection_error(exc) from None
            except (rex.TryAgainError, rex.ClusterError) as exc:
                wait = wait or _SlotWait()
                time.sleep(wait.next(exc))

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        run = pipe.execute

        def execute(*args: Any, **kwargs: Any) -> Any:
            with self._gate():  # counted as one call in flight, as a command is
                return run(*args, **kwargs)

        pipe.execute = execute
        return pipe


class _AsyncPubSub(acluster.ClusterPubSub):
    """redis-py's cluster pub/sub routes its first SUBSCRIBE by the slot map without loading
    it (a KeyError when the client has sent nothing yet): load it first."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.cluster.initialize()
        return await super().execute_command(*args, **kwargs)


class _AsyncCluster(acluster.RedisCluster):
    def __init__(
        self, *, wait_for_connection: bool = False, check_eviction: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**_node_pool(kwargs, wait_for_connection))
        if check_eviction:  # nothing is connected yet; later nodes are made from these kwargs
            checked = checking(self.connection_kwargs["connection_class"])
            self.connection_kwargs["connection_class"] = checked
            for node in self.startup_nodes:
                node.connection_class = checked
        # A node refuses a call past its 100 connections: with wait_for_connection, calls
        # beyond that many in flight wait here instead (dtq/store/inflight.py).
        self._gate: Callable[[], contextlib.AbstractAsyncContextManager[None]] = (
            AsyncInFlight(POOL_CONNECTIONS) if wait_for_connection else no_cap
        )

    def pubsub(self, *args: Any, **kwargs: Any) -> acluster.ClusterPubSub:
        return _AsyncPubSub(self, *args, **kwargs)

    async def initialize(self, *args: Any, **kwargs: Any) -> acluster.RedisCluster:
        try:
            return await super().initialize(*args, **kwargs)
        except redis.RedisClusterException as exc:
            raise _as_connection_error(exc) from None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        wait: _SlotWait | None = None
        while True:
            try:
                async with self._gate():
                    return await super().execute_command(*args, **kwargs)
            except (rex.TryAgainError, rex.ClusterError) as exc:
                wait = wait or _SlotWait()
                await asyncio.sleep(wait.next(exc))

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> acluster.ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        run = pipe.execute

        async def execute(*args: Any, **kwargs: Any) -> Any:
            async with self._gate():  # counted as one call in flight, as a command is
                return await run(*args, **kwargs)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


class _BlockingSentinelPool(AsyncSentinelPool, aredis.BlockingConnectionPool):
    """The Sentinel pool's primary address with the blocking pool's wait for a connection
    (redis-py has no blocking Sentinel pool); neither touches the other's methods."""


class _SyncBlockingSentinelPool(SyncSentinelPool, redis.BlockingConnectionPool):
    """The same for the blocking client."""


def _cluster_kwargs(c: ClusterUrl, kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kwargs.items() if k != "db"}
    out.setdefault("password", c.password)
    out.setdefault("username", c.username)
    if c.ssl:
        out["ssl"] = True
    return {**c.options, **out}


# The SDK's re-send backoff: full jitter over an exponential from 50 ms, capped at 1 s.
RETRY_BASE_S, RETRY_CAP_S = 0.05, 1.0


def _with_retries(kwargs: dict[str, Any], retries: int, retry_class: Any) -> dict[str, Any]:
    if retries > 0 and "retry" not in kwargs:
        backoff = ExponentialWithJitterBackoff(base=RETRY_BASE_S, cap=RETRY_CAP_S)
        kwargs = {**kwargs, "retry": retry_class(backoff, retries)}
    return kwargs


def sync_redis(
    url: str,
    *,
    retries: int = 0,
    wait_for_connection: bool = False,
    check_eviction: bool = False,
    **kwargs: Any,
) -> redis.Redis:
    """A blocking client for ``url`` (any form dtq accepts); options as for :func:`async_redis`."""
    return cast(
        redis.Redis, _client(False, url, retries, wait_for_connection, check_eviction, kwargs)
    )


def async_redis(
    url: str,
    *,
    retries: int = 0,
    wait_for_connection: bool = False,
    check_eviction: bool = False,
    **kwargs: Any,
) -> aredis.Redis:
    """An asyncio client for ``url`` (any form dtq accepts).

    ``retries`` > 0: a command that meets a connection error or a timeout is re-sent that many
    times at most (jittered backoff); only for clients whose every call is safe to re-send (the
    SDK's, docs/faults.md). ``wait_for_connection``: a call made while all
    :data:`POOL_CONNECTIONS` are busy waits for one (up to :data:`POOL_WAIT_S`) instead of
    failing at once: for an application's client. ``check_eviction``: a new connection raises
    :class:`dtq.errors.EvictingRedis` under an ``allkeys-*`` policy (dtq.store.eviction).
    """
    return cast(
        aredis.Redis, _client(True, url, retries, wait_for_connection, check_eviction, kwargs)
    )


def _client(
    aio: bool,
    url: str,
    retries: int,
    wait_for_connection: bool,
    check_eviction: bool,
    kwargs: dict[str, Any],
) -> Any:
    """sync_redis (``aio`` False) or async_redis: the same making with redis-py's two kinds."""
    mod: Any = aredis if aio else redis
    kwargs = _with_retries(kwargs, retries, AsyncRetry if aio else Retry)
    if is_cluster_url(url):
        c = parse_cluster_url(url)
        return (_AsyncCluster if aio else _SyncCluster)(
            startup_nodes=[(acluster if aio else scluster).ClusterNode(h, p) for h, p in c.nodes],
            wait_for_connection=wait_for_connection,
            check_eviction=check_eviction,
            **_cluster_kwargs(c, kwargs),
        )
    if url.startswith(SENTINEL_SCHEME + "://"):
        s = parse_sentinel_url(url)
        timeout = kwargs.get("socket_timeout", 5)
        sentinel = (AsyncSentinel if aio else Sentinel)(s.hosts, socket_timeout=timeout)  # type: ignore[no-untyped-call]
        if wait_for_connection:  # a pool whose calls wait for a connection
            pool_class = _BlockingSentinelPool if aio else _SyncBlockingSentinelPool
            waits = {"max_connections": POOL_CONNECTIONS, "timeout": POOL_WAIT_S}
            kwargs = {**kwargs, "connection_pool_class": pool_class, **waits}
        client = sentinel.master_for(
            s.service, db=s.db, password=s.password, username=s.username, **kwargs
        )
    elif not wait_for_connection:
        client = mod.Redis.from_url(url, **kwargs)
    else:
        pool = mod.BlockingConnectionPool.from_url(
            url, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT_S, **kwargs
        )
        client = mod.Redis.from_pool(pool)
    if check_eviction:
        check_pool(client.connection_pool)
    return client


def display_url(url: str) -> str:
    """``url`` without its password, for logs."""
    parsed = urlparse(url)
    if not parsed.password:
        return url
    netloc = parsed.netloc.rpartition("@")[2]
    user = f"{parsed.username}:***@" if parsed.username else ":***@"
    return parsed._replace(netloc=user + netloc).geturl()


def default_url_warning(settings: Any) -> str | None:
    """A warning when ``DTQ_REDIS_URL`` was left unset: the default, localhost:6379, may be a
    Redis that is not meant for this (someone else's, another project's)."""
    if "redis_url" in settings.model_fields_set:
        return None
    return (
        f"DTQ_REDIS_URL is not set: using the default {settings.redis_url}, whatever Redis "
        "listens there; set DTQ_REDIS_URL (or try everything on a private Redis: dtq dev)"
    )
