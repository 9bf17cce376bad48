"""Redis's eviction policy, and what it means for dtq.

dtq keeps every task in Redis (records, streams, pending lists). Under an ``allkeys-*``
``maxmemory-policy`` Redis may delete any of those keys when it reaches ``maxmemory``: a claim
then finds a stream entry without its record, absorbs it as a duplicate, and the task vanishes
without an error. Under ``volatile-*`` only keys with a TTL go (finished records, idempotency
keys, rate logs): results disappear early but no waiting task is lost. ``noeviction`` (Redis's
default) makes writes fail with ``OOM`` instead, which dtq retries (docs/faults.md).

The SDK's connections check the policy once each, as they connect (:func:`checking`): a
``Client``/``AsyncClient`` raises :class:`dtq.errors.EvictingRedis` instead of writing into such
a Redis, with no extra round trip per call. The worker refuses it at start and re-reads it with
its heartbeat (it stops claiming while Redis evicts).
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import redis.exceptions as redis_exceptions

from dtq.errors import EvictingRedis

C = TypeVar("C", bound=type)

EVICTS_WORK = "allkeys-"
OOM_TEXT = "command not allowed when used memory"  # the OOM reply, with or without its code
EVICTS_TTL_KEYS = "volatile-"


async def eviction_policy(redis: Any) -> str | None:
    """The server's ``maxmemory-policy``: from CONFIG GET, else from INFO memory (where CONFIG
    is renamed or disabled, as on many managed services); None when neither says."""
    try:
        found = await redis.config_get("maxmemory-policy")
        policy = found.get("maxmemory-policy")
        if policy:
            return str(policy)
    except redis_exceptions.ResponseError:  # CONFIG disabled or refused: INFO still tells
        pass
    try:
        info = await redis.info("memory")
    except redis_exceptions.ResponseError:  # INFO refused too (or an in-process fake)
        return None
    policy = info.get("maxmemory_policy")
    return str(policy) if policy else None


def refusal(policy: str | None) -> str | None:
    """The one-line reason a worker must not run under this policy, or None."""
    if policy and policy.startswith(EVICTS_WORK):
        return (
            f"Redis maxmemory-policy is {policy}: Redis may evict queued tasks and streams and "
            "they would vanish without an error; set maxmemory-policy noeviction"
        )
    return None


def warning(policy: str | None) -> str | None:
    """A warning for a policy that loses results early, or None (for noeviction)."""
    if policy and policy.startswith(EVICTS_TTL_KEYS):
        return (
            f"Redis maxmemory-policy is {policy}: at maxmemory Redis evicts keys with a TTL "
            "(finished tasks' results, idempotency keys) early; noeviction is recommended"
        )
    if policy and policy.startswith(EVICTS_WORK):
        return refusal(policy)
    return None


def is_oom(exc: BaseException) -> bool:
    """Redis refused a write because it is at maxmemory (noeviction). A refused script wrote
    nothing: Redis refuses it at its first write that could grow memory, before any other."""
    if isinstance(exc, redis_exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis_exceptions.ResponseError) and OOM_TEXT in str(exc)


def out_of_memory_message(exc: BaseException) -> str:
    """One line for a user whose write Redis refused for memory."""
    text = str(exc).split(". script:")[0]
    return f"Redis is out of memory (maxmemory reached), nothing was written: {text}"


# --- the SDK's check, once per connection ------------------------------------------------------

# What a fresh connection asks, in order, and how each reply says the policy: CONFIG GET, else
# INFO memory (CONFIG renamed or disabled, as on many managed services).
_CONFIG = ("CONFIG", "GET", "maxmemory-policy")
_INFO = ("INFO", "memory")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _from_config(reply: Any) -> str | None:
    """``[name, value]`` (RESP2) or ``{name: value}`` (RESP3)."""
    values = list(reply.values()) if isinstance(reply, dict) else list(reply or [])[1:2]
    return _text(values[0]) if values and values[0] else None


def _from_info(reply: Any) -> str | None:
    for line in _text(reply).splitlines():
        name, _, value = line.partition(":")
        if name == "maxmemory_policy":
            return value.strip() or None
    return None


def _refuse(policy: str | None) -> None:
    why = refusal(policy)
    if why:
        raise EvictingRedis(why)


def check_connection(conn: Any) -> None:
    """Read a new blocking connection's server policy (after AUTH and SELECT); refuse
    allkeys-*. Also a sync Redis Cluster's ``redis_connect_func`` (called after its own)."""
    for args, parse in ((_CONFIG, _from_config), (_INFO, _from_info)):
        try:
            conn.send_command(*args, check_health=False)
            policy = parse(conn.read_response())
        except redis_exceptions.ResponseError:  # refused or renamed: the next one may tell
            continue
        if policy:
            _refuse(policy)
            return


class _SyncCheck:
    """Connection mixin (blocking): after AUTH and SELECT, read the policy; refuse allkeys-*."""

    def on_connect_check_health(self, check_health: bool = True) -> None:
        super().on_connect_check_health(check_health)  # type: ignore[misc]
        check_connection(self)


class _AsyncCheck:
    """The same for asyncio connections."""

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health)  # type: ignore[misc]
        conn: Any = self
        for args, parse in ((_CONFIG, _from_config), (_INFO, _from_info)):
            try:
                await conn.send_command(*args, check_health=False)
                policy = parse(await conn.read_response())
            except redis_exceptions.ResponseError:
                continue
            if policy:
                _refuse(policy)
                return


def checking(connection_class: C) -> C:
    """``connection_class`` with the policy check on connect (sync or asyncio, by its
    ``connect``); unchanged when it checks already."""
    if issubclass(connection_class, _SyncCheck | _AsyncCheck):
        return connection_class
    connect = getattr(connection_class, "connect", None)
    mixin = _AsyncCheck if inspect.iscoroutinefunction(connect) else _SyncCheck
    name = f"EvictionChecked{connection_class.__name__}"
    return type(name, (mixin, connection_class), {})  # type: ignore[return-value]


def check_pool(pool: Any) -> None:
    """Make ``pool``'s new connections check the policy (one server, or Sentinel's primary)."""
    pool.connection_class = checking(pool.connection_class)
