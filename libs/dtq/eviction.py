"""Redis's eviction policy, and what it means for dtq.

dtq keeps every task in Redis (records, streams, pending lists). Under an ``allkeys-*``
``maxmemory-policy`` Redis may delete any of those keys when it reaches ``maxmemory``: a claim
then finds a stream entry without its record, absorbs it as a duplicate, and the task vanishes
without an error. Under ``volatile-*`` only keys with a TTL go (finished records, idempotency
keys, rate logs): results disappear early but no waiting task is lost. ``noeviction`` (Redis's
default) makes writes fail with ``OOM`` instead, which dtq retries (docs/faults.md).
"""

from __future__ import annotations

from typing import Any

import redis.exceptions as redis_exceptions

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
