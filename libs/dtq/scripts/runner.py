"""Running the Lua scripts: their text as sent (:func:`source`), one invocation
(:class:`Call`), the runners (:class:`SyncScripts`, :class:`AsyncScripts`) and the error codes a
script replies with (:class:`ScriptError`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.client import Redis as SyncRedis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dtq.store import cluster, transport
from dtq.store.connection import is_cluster

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "complete",
    "fail",
    "requeue",
    "reclaim",
    "touch",
    "promote",
    "cancel",
    "lock",
    "unlock",
)


def _lua_dir() -> Path:
    """dtq/lua in the wheel, else lua/ at the repository root (an editable install)."""
    packaged = Path(__file__).resolve().parents[1] / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "lua"


INCLUDE = "-- include: "
"""A line (from column 0) naming one include of a script or of another include:
``-- include: <name>`` is ``lua/includes/<name>.lua``."""


class IncludeError(ValueError):
    """A script or an include names an include that does not exist, or includes that include
    one another."""


@cache
def source(name: str) -> str:
    """The full text of ``lua/<name>.lua`` as sent to Redis: see :func:`assemble`."""
    return assemble(_lua_dir(), name)


def assemble(lua_dir: Path, name: str) -> str:
    """The text of script ``<lua_dir>/<name>.lua`` with its includes before it, each once
    and after those it uses; full-line comments and blank lines left out but the first line
    (docs/design.md, "Script includes"). Raises :class:`IncludeError` for a missing include or
    a cycle.
    """
    text = (lua_dir / f"{name}.lua").read_text()
    parts: list[str] = []
    done: set[str] = set()

    def add(inc: str, chain: tuple[str, ...]) -> None:
        if inc in done:
            return
        if inc in chain:
            raise IncludeError("includes form a cycle: " + " -> ".join([*chain, inc]))
        try:
            deps, code = _include(lua_dir, inc)
        except FileNotFoundError:
            by = chain[-1] if chain else f"{name}.lua"
            raise IncludeError(f"{by} includes {inc}: no {lua_dir}/includes/{inc}.lua") from None
        for dep in deps:
            add(dep, (*chain, inc))
        done.add(inc)
        parts.append(code)

    for inc in includes_of(text):
        add(inc, ())
    first, _, rest = text.partition("\n")
    return "".join([first, "\n", *parts, _code(rest)])


def includes_of(text: str) -> list[str]:
    """The includes a file names, in its order."""
    return [
        line.removeprefix(INCLUDE).strip() for line in text.splitlines() if line.startswith(INCLUDE)
    ]


@cache
def _include(lua_dir: Path, name: str) -> tuple[list[str], str]:
    """An include's own includes and its text as sent (read once per process: every script's
    source asks, and a worker builds them all at start)."""
    text = (lua_dir / "includes" / f"{name}.lua").read_text()
    return includes_of(text), _code(text)


def _code(text: str) -> str:
    """``text`` without its full-line comments and blank lines."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if line.strip() and not line.lstrip().startswith("--")
    )


class ScriptError(StrEnum):
    """Every error code a dtq script replies with (``redis.error_reply('<code> <detail>')``);
    redis-py raises it as a :class:`ResponseError` whose message starts with the code."""

    BAD_CALL = "DTQ_BAD_CALL"
    """The call was built wrong (enqueue.lua: a task's band has no stream among the KEYS):
    a bug in the caller; nothing was written."""
    DUPLICATE_ID = "DTQ_DUPLICATE_ID"
    """schedule_fire.lua: a record with the task id it was given exists; nothing was written."""

    @classmethod
    def of(cls, exc: ResponseError) -> ScriptError | None:
        """The code of a script's error reply, or None for any other error (Redis's own)."""
        code = str(exc).split(" ", 1)[0]
        return cls(code) if code in cls._value2member_map_ else None


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation, ready to send."""

    script: str
    keys: list[str]
    args: list[Any]


# The fast lane (dtq.store.transport; on a cluster one per node, dtq.store.cluster) is asked
# first; redis-py's usual path takes what it cannot do. In a cluster pipeline a script is sent as
# EVAL (redis-py refuses EVALSHA there).
# The slot guard: a key of the call's slot that never exists, so a slot in migration answers
# TRYAGAIN and no script runs half on the old owner (docs/faults.md).
SLOT_GUARD = ":~slotguard"


def with_slot_guard(keys: list[str], tag: str | None = None) -> list[str]:
    """``keys`` and the slot guard of their slot (``tag``: the first key's hash tag, as Redis
    reads it, found here when not given)."""
    tag = cluster.hash_tag(keys[0]) if tag is None else tag
    return [*keys, "{" + tag + "}" + SLOT_GUARD]


def _evalsha_args(sha: str, call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", sha, len(call.keys), *call.keys, *call.args)


class _Registered:
    """The Script objects of one client, every lua/<name>.lua registered on first use (the
    usual ones at once); what the sync and async runners share."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._objs: dict[str, Any] = {n: redis.register_script(source(n)) for n in SCRIPT_NAMES}

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            obj = self._objs[name] = self._redis.register_script(source(name))
        return obj

    def evalsha(self, call: Call) -> tuple[Any, ...]:
        """The EVALSHA command of ``call``, to send on a connection of one's own (a NOSCRIPT
        reply means it did not run; ``run`` loads the script)."""
        return _evalsha_args(self._obj(call.script).sha, call)


class AsyncScripts(_Registered):
    """Runs calls on an asyncio Redis client (EVALSHA, reloading after a NOSCRIPT).

    Any ``lua/<name>.lua`` can be called; each is registered on first use.
    """

    _redis: AsyncRedis

    def __init__(
        self, redis: AsyncRedis, *, replay_safe: bool = False, fast_lane: bool | None = None
    ) -> None:
        """``replay_safe``: as for :class:`SyncScripts`. ``fast_lane``: Settings.fast_lane
        (None: DTQ_FAST_LANE); the lane is used only where dtq.store.transport finds what it
        needs."""
        super().__init__(redis)
        self._replay_safe = replay_safe
        self._cluster = is_cluster(redis)  # (see the fast lane above)
        lane = transport.fast_lane(fast_lane)
        self._lanes = transport.AsyncLanes(redis) if lane and not self._cluster else None
        self.routes = cluster.AsyncRoutes(redis) if lane and self._cluster else None
        # Told of every call outside a pipeline whose reply may have been lost after Redis ran
        # it, re-sent or not (a worker recovers the runs such a claim started: lua/recover.lua).
        self.on_reply_lost: Callable[[Call], None] | None = None

    @property
    def lanes(self) -> list[transport.AsyncLane]:
        """The lanes made so far (none without the fast lane)."""
        return [] if self._lanes is None else self._lanes.lanes

    async def run(self, call: Call, pipe: AsyncPipeline | None = None) -> Any:
        obj = self._obj(call.script)
        keys = call.keys
        if self._cluster:  # (see the fast lane and the slot guard above)
            tag = cluster.hash_tag(keys[0])
            keys = with_slot_guard(keys, tag)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)
            lane = None if self.routes is None else self.routes.free(tag)
        elif pipe is not None:
            return await obj(keys=keys, args=call.args, client=pipe)
        else:
            lane = None if self._lanes is None else self._lanes.free()
        if lane is not None:
            res = await self._on_lane(
                lane, ("EVALSHA", obj.sha, len(keys), *keys, *call.args), call
            )
            if res is not transport.MISS:
                return res
        try:
            return await obj(keys=keys, args=call.args)
        except (ConnectionError, RedisTimeoutError, TimeoutError):
            self._reply_lost(call)
            raise

    async def _on_lane(self, lane: transport.AsyncLane, args: tuple[Any, ...], call: Call) -> Any:
        """``args`` sent on ``lane``: the reply, or MISS when the usual path is to run it."""
        lane.busy = True
        try:
            res = await lane.call(args)
            if self.routes is not None:
                self.routes.calls += 1
            return res
        except NoScriptError:
            pass  # nothing ran: the usual path loads the script
        except cluster.NOT_RUN_HERE:  # not this node's slot (any more): nothing ran
            assert self.routes is not None  # (only a cluster's nodes answer so)
            self.routes.forget()
        except ConnectionError:  # the usual path sends again; the first send may have run
            self._reply_lost(call)
            if self.routes is not None:
                self.routes.forget()  # (the node may be gone: a failover)
        except (RedisTimeoutError, TimeoutError):  # may have run: re-sent only if replay_safe
            self._reply_lost(call)
            if not self._replay_safe:
                raise
        finally:
            lane.busy = False
        return transport.MISS

    def _reply_lost(self, call: Call) -> None:
        if self.on_reply_lost is not None:
            self.on_reply_lost(call)

    async def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """:meth:`SyncScripts.run_many` for asyncio: streamed over one lane, reply k read (and
        handed to ``each``) after call k + 1 was sent; the same rules for errors."""
        calls = iter(calls)
        lane = None if self._lanes is None else self._lanes.free()
        if lane is None:
            return transport.each_reply([await self.run(c) for c in calls], each)
        st = transport.Stream(each)
        lane.busy = True
        try:
            await lane.stream(calls, self.evalsha, st)
        finally:
            lane.busy = False
        if st.fallback:  # nothing was sent: every call goes the usual way
            return transport.each_reply([await self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, await self.run(c))
        return st.replies


def hiredis_packing(client: AsyncRedis, *, fast_lane: bool | None = None) -> AsyncRedis:
    """Make ``client``'s new connections pack with hiredis (dtq.store.transport; a no-op on a
    cluster, whose nodes make their own, and without the fast lane)."""
    return client if is_cluster(client) else transport.hiredis_packing(client, setting=fast_lane)


class SyncScripts(_Registered):
    """Runs calls on a blocking Redis client (thread-safe; see the fast lane above)."""

    _redis: SyncRedis

    def __init__(
        self, redis: SyncRedis, *, replay_safe: bool = False, fast_lane: bool | None = None
    ) -> None:
        """``replay_safe``: every call run here may be re-sent (the SDK's: see docs/faults.md),
        so a lane call that timed out goes the usual way too, whose retry policy re-sends it.
        ``fast_lane``: as for :class:`AsyncScripts`."""
        super().__init__(redis)
        self._cluster = is_cluster(redis)
        lane = transport.fast_lane(fast_lane)
        self.lane = (
            transport.SyncLane(redis, replay_safe=replay_safe)
            if lane and not self._cluster
            else None
        )
        self.routes = (
            cluster.SyncRoutes(redis, replay_safe=replay_safe) if lane and self._cluster else None
        )

    def run(self, call: Call, pipe: Pipeline | None = None) -> Any:
        obj = self._obj(call.script)
        if self._cluster:  # (see the fast lane and the slot guard above)
            tag = cluster.hash_tag(call.keys[0])
            keys = with_slot_guard(call.keys, tag)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)  # type: ignore[no-untyped-call]
            if self.routes is not None:
                args = ("EVALSHA", obj.sha, len(keys), *keys, *call.args)
                res = self.routes.call(tag, args)
                if res is not transport.MISS:
                    return res
            return obj(keys=keys, args=call.args)
        if pipe is None and self.lane is not None:
            res = self.lane.call(_evalsha_args(obj.sha, call))
            if res is not transport.MISS:
                return res
        return obj(keys=call.keys, args=call.args, client=pipe)

    def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Run ``calls`` in order; the replies in order (a script's error is raised).

        Over the lane call k's reply is read (and handed to ``each(k, reply)``, errors aside)
        only after call k + 1 was sent, so Redis runs one call while the client builds the next.
        A connection lost after the first send raises: nothing that may have run is resent.
        """
        calls = iter(calls)
        st = transport.Stream(each)
        if self.lane is None or not self.lane.stream(calls, self.evalsha, st):
            return transport.each_reply([self.run(c) for c in calls], each)
        if st.fallback:  # nothing was sent: every call goes the usual way
            return transport.each_reply([self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, self.run(c))
        return st.replies


def to_str(v: Any) -> str:
    """A reply element as text (a client made without decode_responses answers bytes)."""
    return v.decode() if isinstance(v, bytes) else str(v)


# How long a state-changing SDK call's reply is kept for its re-send (lua/includes/replayed.lua):
# longer than any client's re-send window.
REPLY_TTL_MS = 60_000


def new_nonce() -> str:
    """A per-call nonce: the same call re-sent after a blip carries it and gets the first
    send's reply (lua/includes/replayed.lua)."""
    return secrets.token_hex(8)
