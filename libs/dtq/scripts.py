"""Loading the Lua scripts and one typed wrapper per atomic transition.

Each script lives in ``lua/<name>.lua`` (shipped in the wheel as ``dtq/lua``) with a header that
lists its KEYS, ARGV and return value; ``lua/_common.lua`` is prepended to each. The wrappers
build the KEYS/ARGV lists (pure functions returning a :class:`Call`) and turn the raw reply into
a small frozen dataclass, so the sync client, the async client and the worker share them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.client import Redis as SyncRedis
from redis.exceptions import ConnectionError, DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # the hiredis reader's "no whole reply yet" (redis-py's hiredis parser, 5.x-8.x)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - another redis-py: the lane reads the usual way
    _NOT_ENOUGH_DATA = None

from dtq.connection import is_cluster
from dtq.keys import GROUP, QueueKeys

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _hiredis_pack = None  # type: ignore[assignment]

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
    # The wheel ships the scripts as dtq/lua, beside this module (importlib.resources would say
    # the same, at 13 ms of import time for every process).
    packaged = Path(__file__).resolve().parent / "lua"
    if packaged.is_dir():
        return packaged
    # Editable install / source tree: lua/ sits at the repository root.
    return Path(__file__).resolve().parents[2] / "lua"


@cache
def source(name: str) -> str:
    """The full text of a script as sent to Redis: the shared helpers it uses, then the script.

    A script line ``-- include: _part`` prepends ``lua/_part.lua`` too (after the helpers):
    claim.lua and complete.lua share the claim transition that way. Of ``_common.lua`` only the
    definitions the script (or a definition it keeps) names are sent: Redis runs a script's
    whole text on every call, and each helper it defines is a closure made and collected per
    call (about 1 us per call for all of them, cache-cold, on a single enqueue).
    """
    d = _lua_dir()
    text = (d / f"{name}.lua").read_text()
    parts = []
    for line in text.splitlines():
        if line.startswith("-- include: "):
            parts.append((d / f"{line.removeprefix('-- include: ').strip()}.lua").read_text())
    body = "\n".join([*parts, text])
    return "\n".join([helpers_for(body, (d / "_common.lua").read_text()), body])


_DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*=)", re.MULTILINE)


def helpers_for(body: str, common: str) -> str:
    """The definitions of ``common`` that ``body`` needs, directly or through one another, in
    their order (a Lua local can only name locals defined before it). A definition starts at a
    ``local`` line in column 0 and takes the comment lines just above it."""
    blocks: list[tuple[set[str], str]] = []
    lead: list[str] = []  # comment lines waiting for their definition
    for line in common.splitlines(keepends=True):
        m = _DEFINES.match(line)
        if m:
            names = {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
            blocks.append((names, "".join(lead) + line))
            lead = []
        elif line.startswith("--") or not line.strip() or not blocks:
            lead.append(line)  # a comment or blank line: the next definition's, or ...
        else:  # ... the definition goes on (any code line, in or after its body)
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + "".join(lead) + line)
            lead = []
    used = [False] * len(blocks)
    corpus = [body]
    for i in range(len(blocks) - 1, -1, -1):  # later definitions can only use earlier ones
        names, block = blocks[i]
        if any(re.search(rf"\b{n}\b", c) for n in names for c in corpus):
            used[i] = True
            corpus.append(block)
    return "".join(b for (_, b), u in zip(blocks, used, strict=True) if u)


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation, ready to send."""

    script: str
    keys: list[str]
    args: list[Any]


# The fast lane. A script call through redis-py's command layer (pool checkout with its
# readiness check, the retry wrapper, instrumentation) costs about 30-50 us of client CPU on top
# of the round trip; a single enqueue is one call, so that was a third of its time. Each Scripts
# object keeps one connection of its client's pool for calls made outside a pipeline and writes
# the packed EVALSHA to it directly. Whatever the lane cannot do goes the usual way: a NOSCRIPT
# (redis-py loads the script and calls again: nothing ran), a lane busy with another call (a
# second thread or task), a broken connection (dropped; the usual path reconnects and retries,
# as redis-py does). A timeout is raised as is: the call may have run, so it is not resent here.
#
# On a Redis Cluster there is no lane: a kept connection knows one node, not the slot map, so
# every call takes the cluster client's path (which follows MOVED/ASK and retries TRYAGAIN).
# ``is_cluster`` at construction is the one decision; ``_lanes_ok`` carries it. In a cluster
# pipeline redis-py refuses EVALSHA (it could not load a missing script there): a script call
# in a pipeline is sent as EVAL with its text, which Redis caches under the same SHA.
#
# The slot guard. A script reaches keys it was not given (a task's record, ``base .. tid``):
# same hash tag, so same slot, which is all a stable cluster needs. While that slot migrates,
# though, such a key may already be on the new node: Redis 7 then fails the script at that
# access ("non local key") with its earlier writes kept, a transition done half-way. On a
# cluster each call therefore declares one more key, of its slot, that never exists: a node
# serving a slot in migration answers TRYAGAIN (or ASK, then TRYAGAIN) to a call missing a key,
# so no script runs at all until the migration ends, and then it runs whole on the new owner.
# TRYAGAIN means "not run": the cluster client waits it out (connection.py). On a stable slot
# the guard costs nothing (Redis looks keys up only for slots in migration). Scripts that count
# their KEYS leave it out (``nkeys()`` in lua/_common.lua).
SLOT_GUARD = ":~slotguard"


def with_slot_guard(keys: list[str]) -> list[str]:
    """``keys`` and the slot guard of their slot (the first key's hash tag, as Redis reads it)."""
    first = keys[0]
    lo = first.find("{")
    hi = first.find("}", lo + 1) if lo >= 0 else -1
    tag = first[lo + 1 : hi] if lo >= 0 and hi > lo + 1 else first
    return [*keys, "{" + tag + "}" + SLOT_GUARD]


_MISS: Any = object()
# How long a reply of a pair is still read for once its deadline has passed (AsyncLane.call_pair).
LATE_REPLY_S = 0.5
MAX_ASYNC_LANES = 4  # per AsyncScripts: calls in flight at once beyond this take the usual path


def _evalsha_args(sha: str, call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", sha, len(call.keys), *call.keys, *call.args)


def _packed(conn: Any, sha: str, call: Call) -> Any:
    """The EVALSHA of ``call`` as bytes for ``conn``: hiredis directly where it is there (a
    blocking connection's pack_command checks every argument in Python first: 6.9 against
    2.4 us for an enqueue)."""
    args = _evalsha_args(sha, call)
    if _hiredis_pack is None:  # pragma: no cover - hiredis comes with redis[hiredis]
        return conn.pack_command(*args)
    try:
        return [_hiredis_pack(args)]
    except TypeError as exc:
        raise DataError(str(exc)) from None


def _each(replies: list[Any], each: Callable[[int, Any], None] | None) -> list[Any]:
    """Hand ``replies`` to ``each`` in order (run_many's fallback); returns them."""
    if each is not None:
        for k, r in enumerate(replies):
            each(k, r)
    return replies


class _Stream:
    """The bookkeeping of one streamed run_many (the sync and async ones share it)."""

    __slots__ = ("each", "error", "replies", "sent", "unsent")

    def __init__(self, each: Callable[[int, Any], None] | None) -> None:
        self.each = each
        self.sent: list[Call] = []
        self.replies: list[Any] = []
        self.error: ResponseError | None = None
        self.unsent: Call | None = None  # taken from the calls, its send failed: not sent at all

    def read(self, reply: Any) -> None:
        """Record a reply (a :class:`ResponseError` instance for an error reply)."""
        if isinstance(reply, NoScriptError):
            reply = _MISS
        elif isinstance(reply, ResponseError):
            self.replies.append(None)
            self.error = self.error or reply
            return
        self.replies.append(reply)
        if self.each is not None and reply is not _MISS and self.error is None:
            self.each(len(self.replies) - 1, reply)

    @property
    def behind(self) -> int:
        """Calls sent whose reply was not read yet."""
        return len(self.sent) - len(self.replies)

    def rest(self, calls: Iterator[Call]) -> Iterator[Call]:
        """For the fallback (nothing was sent): every call, the one whose send failed first."""
        return calls if self.unsent is None else itertools.chain([self.unsent], calls)

    def misses(self) -> list[tuple[int, Call]]:
        """Raise the first error reply; else the calls that answered NOSCRIPT (did not run)."""
        if self.error is not None:
            raise self.error
        return [(k, c) for k, (c, r) in enumerate(zip(self.sent, self.replies, strict=True))
                if r is _MISS]  # fmt: skip

    def rerun(self, k: int, reply: Any) -> None:
        self.replies[k] = reply
        if self.each is not None:
            self.each(k, reply)


class AsyncLane:
    """One connection of an asyncio client's pool, kept and written to directly (see above).

    ``call`` raises whatever the command raised. A Redis error reply leaves the connection in
    step; anything else (a broken connection, a timeout, a cancel mid-reply) drops it, so no
    later call can read a reply meant for this one. ``busy`` is for callers sharing a lane.
    """

    def __init__(self, client: AsyncRedis) -> None:
        self._client = client
        self._conn: Any = None
        self.busy = False

    async def connection(self) -> Any:
        if self._conn is None:
            self._conn = await self._client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        return self._conn

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)
            await self._client.connection_pool.release(conn)

    async def call(self, args: Sequence[Any]) -> Any:
        conn = await self.connection()
        try:
            await conn.send_packed_command(conn.pack_command(*args), check_health=False)
            return await conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            await self.drop()
            raise

    async def call_pair(
        self, first: Sequence[Any], then: Sequence[Any], timeout: float
    ) -> tuple[Any, Any]:
        """Send two commands in one write and read both replies (an error reply is returned
        as its :class:`ResponseError`, not raised, so the lane stays in step).

        Redis runs ``then`` as soon as ``first`` has been served on this connection, a blocking
        ``first`` included: no round trip through this process between the two.

        ``timeout`` (from the send) bounds a hung connection: past it the lane is dropped and
        :class:`TimeoutError` raised. A process frozen past it (SIGSTOP, a VM pause) resumes
        with the deadline already gone and the replies already in its socket: those are still
        read (for up to :data:`LATE_REPLY_S`), not thrown away with the connection, which would
        lose what ``then`` did.
        """
        conn = await self.connection()
        try:
            await conn.send_packed_command(
                [*conn.pack_command(*first), *conn.pack_command(*then)], check_health=False
            )
            deadline = asyncio.get_running_loop().time() + timeout
            one = await _read_by(conn, deadline)
            return one, await _read_by(conn, deadline)
        except BaseException:
            await self.drop()
            raise


async def _read_by(conn: Any, deadline: float) -> Any:
    """One reply of a pair (see :meth:`AsyncLane.call_pair`); an error reply is returned."""
    try:
        try:
            async with asyncio.timeout_at(deadline):
                return await conn.read_response(disconnect_on_error=False)
        except TimeoutError:
            pass
        # The parser keeps what it had read: a cancelled read loses nothing, so a second one
        # picks up where it stopped.
        async with asyncio.timeout(LATE_REPLY_S):
            return await conn.read_response(disconnect_on_error=False)
    except ResponseError as exc:
        return exc


class AsyncScripts:
    """Runs calls on an asyncio Redis client (EVALSHA, reloading after a NOSCRIPT).

    Any ``lua/<name>.lua`` can be called; each is registered on first use.
    """

    def __init__(self, redis: AsyncRedis, *, replay_safe: bool = False) -> None:
        """``replay_safe``: as for :class:`SyncScripts`."""
        self._redis = redis
        self._replay_safe = replay_safe
        self._lanes_ok = not is_cluster(redis)  # (see the fast lane above)
        self._objs = {n: redis.register_script(source(n)) for n in SCRIPT_NAMES}
        # Several lanes: calls of one process overlap (a worker has two outcome writes in
        # flight, a heartbeat, a claim), and each would otherwise take the slow path.
        self._lanes: list[AsyncLane] = []
        # Told of every call outside a pipeline whose reply may have been lost after Redis ran
        # it (a broken connection or a timeout once it was sent), re-sent or not: a worker
        # looks for the runs such a claim started (lua/recover.lua).
        self.on_reply_lost: Callable[[Call], None] | None = None

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            obj = self._objs[name] = self._redis.register_script(source(name))
        return obj

    def evalsha(self, call: Call) -> tuple[Any, ...]:
        """The EVALSHA command of ``call``, to send on a connection of one's own (a NOSCRIPT
        reply means it did not run; :meth:`run` loads the script)."""
        return _evalsha_args(self._obj(call.script).sha, call)

    async def run(self, call: Call, pipe: AsyncPipeline | None = None) -> Any:
        obj = self._obj(call.script)
        if not self._lanes_ok:  # a cluster (see the fast lane and the slot guard above)
            keys = with_slot_guard(call.keys)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)
            try:
                return await obj(keys=keys, args=call.args)
            except (ConnectionError, RedisTimeoutError, TimeoutError):
                self._reply_lost(call)  # as on the usual path below
                raise
        if pipe is not None:
            return await obj(keys=call.keys, args=call.args, client=pipe)
        lane = self._free_lane()
        if lane is not None:
            lane.busy = True
            try:
                return await lane.call(_evalsha_args(obj.sha, call))
            except NoScriptError:
                pass  # nothing ran: the usual path loads the script
            except ConnectionError:
                # The lane was dropped (the usual path reconnects and sends again); the first
                # send may have run, its reply lost.
                self._reply_lost(call)
            except (RedisTimeoutError, TimeoutError):
                # The lane was dropped; the call may have run. Only a runner whose calls are
                # safe to re-send (the SDK's) sends it again.
                self._reply_lost(call)
                if not self._replay_safe:
                    raise
            finally:
                lane.busy = False
        try:
            return await obj(keys=call.keys, args=call.args)
        except (ConnectionError, RedisTimeoutError, TimeoutError):
            self._reply_lost(call)
            raise

    def _reply_lost(self, call: Call) -> None:
        if self.on_reply_lost is not None:
            self.on_reply_lost(call)

    async def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """:meth:`SyncScripts.run_many` for asyncio: streamed over one lane, reply k read (and
        handed to ``each``) after call k + 1 was sent; the same rules for errors."""
        calls = iter(calls)
        lane = self._free_lane()
        if lane is None:
            return _each([await self.run(c) for c in calls], each)
        st = _Stream(each)
        fallback = False
        lane.busy = True
        try:
            conn = await lane.connection()

            async def read_one() -> None:
                try:
                    st.read(await conn.read_response())
                except ResponseError as exc:
                    st.read(exc)

            try:
                if await conn.can_read():  # EOF: the server closed the lane meanwhile
                    raise ConnectionError("the lane has unread data")
                for call in calls:
                    st.unsent = call
                    args = _evalsha_args(self._obj(call.script).sha, call)
                    await conn.send_packed_command(conn.pack_command(*args), check_health=False)
                    st.unsent = None
                    st.sent.append(call)
                    if st.behind > 1:
                        await read_one()
                while st.behind:  # every reply is read: the lane stays in step
                    await read_one()
            except ConnectionError:
                await lane.drop()
                if st.sent:
                    raise
                fallback = True
            except BaseException:
                await lane.drop()
                raise
        finally:
            lane.busy = False
        if fallback:  # nothing was sent: every call goes the usual way
            return _each([await self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, await self.run(c))
        return st.replies

    def _free_lane(self) -> AsyncLane | None:
        if not self._lanes_ok:
            return None
        for lane in self._lanes:
            if not lane.busy:
                return lane
        if len(self._lanes) < MAX_ASYNC_LANES:
            lane = AsyncLane(self._redis)
            self._lanes.append(lane)
            return lane
        return None


class _HiredisPacking:
    """Connection mixin: pack commands with hiredis, as redis-py's sync connections already do.

    redis-py's asyncio connections pack in Python and copy the growing buffer once per
    argument: a batched claim/complete call (about 180 arguments) took ~130 us to pack, ~17 us
    with hiredis, byte for byte the same output.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        try:
            return [_hiredis_pack(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from None


def hiredis_packing(client: AsyncRedis) -> AsyncRedis:
    """Make ``client``'s new connections pack with hiredis (no-op without hiredis)."""
    if _hiredis_pack is None or is_cluster(client):  # a cluster's nodes make their own
        return client
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, _HiredisPacking):
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return client


# Forks of this process so far, counted in the child (os.getpid per call is a system call).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def _send(conn: Any, chunks: list[bytes]) -> None:
    """Send a packed command on a blocking connection: one ``write`` for a plain socket.

    A socket with a timeout (redis-py's default is 5 s) makes Python ``poll`` before every
    send; a request of a few hundred bytes always fits the send buffer, so that poll is a
    system call for nothing. What the write did not take (a large call) and any other socket
    (TLS) go the usual way, which waits with the timeout.
    """
    sock = conn._sock
    if type(sock) is not socket.socket or len(chunks) != 1:
        conn.send_packed_command(chunks, False)
        return
    data = chunks[0]
    try:
        n = os.write(sock.fileno(), data)
    except BlockingIOError:
        n = 0
    except OSError as exc:
        conn.disconnect()
        raise ConnectionError(f"Error while writing to socket: {exc}") from None
    if n < len(data):
        conn.send_packed_command([memoryview(data)[n:]], False)


def _read(conn: Any) -> Any:
    """The next reply on a blocking connection, read by its hiredis reader directly.

    ``Connection.read_response`` wraps each read in layers the lane does not need (the host's
    name formatted for a message, health-check bookkeeping, RESP3 push handling); what it
    guarantees is kept: a timeout or a socket error drops the connection and raises redis-py's
    TimeoutError / ConnectionError, an error reply raises. Other parsers and sockets go the
    usual way.
    """
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    sock = conn._sock
    if _NOT_ENOUGH_DATA is None or reader is None or type(sock) is not socket.socket:
        return conn.read_response()  # (TLS, a test double's socket, not connected)
    reply = reader.gets()
    try:
        while reply is _NOT_ENOUGH_DATA:
            n = sock.recv_into(parser._buffer)
            if n == 0:
                raise ConnectionError("Connection closed by server.")
            reader.feed(parser._buffer, 0, n)
            reply = reader.gets()
    except TimeoutError:  # socket.timeout
        conn.disconnect()
        raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None
    except OSError as exc:
        conn.disconnect()
        raise ConnectionError(f"Error while reading from {conn._host_error()}: {exc}") from None
    except BaseException:
        conn.disconnect()
        raise
    if isinstance(reply, ResponseError):
        raise reply
    return reply


class SyncScripts:
    """Runs calls on a blocking Redis client (thread-safe; see the fast lane above)."""

    def __init__(self, redis: SyncRedis, *, replay_safe: bool = False) -> None:
        """``replay_safe``: every call run here may be re-sent (the SDK's: see docs/faults.md),
        so a lane call that timed out goes the usual way too, whose retry policy re-sends it."""
        self._redis = redis
        self._replay_safe = replay_safe
        self._lanes_ok = not is_cluster(redis)  # (see the fast lane above)
        self._objs = {n: redis.register_script(source(n)) for n in SCRIPT_NAMES}
        self._lane: Any = None
        self._lane_forks = -1
        self._lane_lock = threading.Lock()

    def run(self, call: Call, pipe: Pipeline | None = None) -> Any:
        obj = self._obj(call.script)
        if not self._lanes_ok:  # a cluster (see the fast lane and the slot guard above)
            keys = with_slot_guard(call.keys)
            if pipe is not None:
                return pipe.execute_command("EVAL", obj.script, len(keys), *keys, *call.args)  # type: ignore[no-untyped-call]
            return obj(keys=keys, args=call.args)
        if pipe is None and self._lanes_ok and self._lane_lock.acquire(blocking=False):
            try:
                res = self._lane_call(obj.sha, call)
            finally:
                self._lane_lock.release()
            if res is not _MISS:
                return res
        return obj(keys=call.keys, args=call.args, client=pipe)

    def run_many(
        self, calls: Iterable[Call], each: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Run ``calls`` in order; the replies in order (a script's error is raised).

        Over the lane each call is sent as soon as it is built, and the reply of call k is read
        (and handed to ``each(k, reply)``) only after call k + 1 was sent: Redis runs one call
        while the client builds the next and handles the one before (a bulk enqueue overlaps
        its encoding and its handles with the scripts). ``each`` sees every reply that is not
        an error, in order. Nothing is resent that may have run: a connection lost after the
        first send raises.
        """
        calls = iter(calls)
        if not self._lanes_ok or not self._lane_lock.acquire(blocking=False):
            return _each([self.run(c) for c in calls], each)
        st = _Stream(each)
        fallback = False
        try:
            conn = self._lane_conn()

            def read_one() -> None:
                try:
                    st.read(conn.read_response())
                except ResponseError as exc:
                    st.read(exc)

            try:
                # A lane the server closed meanwhile (a restart, an idle timeout) reads as EOF:
                # find out before the first send, when the usual path can still run it all.
                if conn.can_read():
                    raise ConnectionError("the lane has unread data")
                for call in calls:
                    st.unsent = call
                    sha = self._obj(call.script).sha
                    conn.send_packed_command(_packed(conn, sha, call), False)
                    st.unsent = None
                    st.sent.append(call)
                    if st.behind > 1:
                        read_one()
                while st.behind:  # every reply is read: the lane stays in step
                    read_one()
            except ConnectionError:
                self._drop_lane()
                if st.sent:
                    raise
                fallback = True
            except BaseException:
                self._drop_lane()
                raise
        finally:
            self._lane_lock.release()
        if fallback:  # nothing was sent: every call goes the usual way
            return _each([self.run(c) for c in st.rest(calls)], each)
        for k, c in st.misses():  # NOSCRIPT: that call did not run
            st.rerun(k, self.run(c))
        return st.replies

    def _obj(self, name: str) -> Any:
        obj = self._objs.get(name)
        if obj is None:
            obj = self._objs[name] = self._redis.register_script(source(name))
        return obj

    def _lane_conn(self) -> Any:
        conn = self._lane
        if conn is None or self._lane_forks != _forks:  # a forked child gets its own
            conn = self._lane = self._redis.connection_pool.get_connection()
            self._lane_forks = _forks
        return conn

    def _lane_call(self, sha: str, call: Call) -> Any:
        conn = self._lane_conn()
        try:
            _send(conn, _packed(conn, sha, call))
            return _read(conn)
        except NoScriptError:
            return _MISS
        except ResponseError:
            raise
        except ConnectionError:
            self._drop_lane()
            return _MISS
        except RedisTimeoutError:
            self._drop_lane()
            if self._replay_safe:
                return _MISS
            raise
        except BaseException:
            self._drop_lane()
            raise

    def _drop_lane(self) -> None:
        conn, self._lane = self._lane, None
        if conn is not None:
            conn.disconnect()
            self._redis.connection_pool.release(conn)


# --- enqueue ---------------------------------------------------------------------------------


@dataclass(slots=True)
class NewTask:
    """One task to create, already validated and encoded (not frozen: made once per enqueue,
    and a frozen dataclass's __init__ costs three times as much)."""

    tid: str
    name: str
    args: str
    kwargs: str
    priority: int
    max_retries: int  # dtq's default when left to the worker's declaration ("m" in unset)
    timeout: float | None
    delay_ms: int
    expires_ms: int
    idempotency_key: str
    meta: str
    limit: str = ""  # dtq.limits.Limit.encode(): "conc|count|window_ms|key", or ""
    unset: str = ""  # letters of what the enqueue left to the declaration (dtq.declared)
    headers: str = ""  # JSON object of strings from middleware (dtq.middleware), or ""

    def maxr_arg(self) -> int | str:
        """enqueue.lua's max_retries field: the number, or "~<unset letters><number>"."""
        return f"~{self.unset}{self.max_retries}" if self.unset else self.max_retries


@dataclass(frozen=True, slots=True)
class Enqueued:
    tid: str
    status: str
    created: bool


def enqueue_call(qk: QueueKeys, tasks: Sequence[NewTask], events_maxlen: int) -> Call:
    if len(tasks) == 1:
        return enqueue_one_call(qk.prefix, qk.queue, tasks[0], events_maxlen)
    args: list[Any] = [events_maxlen, len(tasks)]
    for t in tasks:  # plain tasks send their 5 fixed fields only (see enqueue.lua)
        if _has_options(t):
            args = [events_maxlen, len(tasks)]
            for t in tasks:
                args += _task_args(t)
            break
        args += (t.tid, t.name, t.args, t.priority, t.maxr_arg() if t.unset else t.max_retries)
    head, streams = _enqueue_keys(qk.prefix, qk.queue)
    # Only the bands used: enqueue.lua finds each stream by its last character.
    return Call("enqueue", [*head, *(streams[p] for p in {t.priority for t in tasks})], args)


def enqueue_one_call(prefix: str, queue: str, t: NewTask, events_maxlen: int) -> Call:
    """:func:`enqueue_call` of one task, from the key prefix and queue name (the single
    enqueue's path: no QueueKeys is made, and the keys are looked up by two strings). A task
    without options sends only its 5 fixed fields (enqueue.lua reads the missing 8 as empty)."""
    head, streams = _enqueue_keys(prefix, queue)
    if _has_options(t):
        args = [events_maxlen, 1, *_task_args(t)]
    else:
        mr = t.maxr_arg() if t.unset else t.max_retries
        args = [events_maxlen, 1, t.tid, t.name, t.args, t.priority, mr]
    return Call("enqueue", [*head, streams[t.priority]], args)


def _has_options(t: NewTask) -> bool:
    """Whether any of the 8 options of enqueue.lua's task fields is set."""
    return bool(
        t.kwargs or t.timeout is not None or t.delay_ms or t.expires_ms or t.idempotency_key
        or t.meta or t.limit or t.headers
    )  # fmt: skip


def _task_args(t: NewTask) -> list[Any]:
    """enqueue.lua's 13 fields of one task: the 5 fixed ones, then the 8 options."""
    return [
        t.tid, t.name, t.args, t.priority, t.maxr_arg(), t.kwargs,
        "" if t.timeout is None else repr(float(t.timeout)), t.delay_ms, t.expires_ms,
        t.idempotency_key, t.meta, t.limit, t.headers,
    ]  # fmt: skip


# Key lists of the hot-path scripts, built once per queue (each is ~15-18 formatted strings;
# bounded for clients that use many queue names).
@lru_cache(maxsize=512)
def _enqueue_keys(prefix: str, queue: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """enqueue.lua's fixed keys, and the stream of each band indexed by priority."""
    qk = QueueKeys(prefix, queue)
    return (qk.sched, qk.events, qk.task_base, qk.idem_base), tuple(map(qk.stream, range(10)))


@lru_cache(maxsize=512)
def _claim_keys(qk: QueueKeys) -> tuple[str, ...]:
    return (
        *qk.streams, qk.paused, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.sched,
        qk.lim_base, qk.fair, qk.decl, qk.flow_base, qk.flowq,
    )  # fmt: skip


def parse_enqueue(raw: list[Any]) -> list[Enqueued]:
    return [
        Enqueued(_s(raw[i]), _s(raw[i + 1]), int(raw[i + 2]) == 1) for i in range(0, len(raw), 3)
    ]


# --- claim -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run this worker now owns: (tid, attempt) is started exactly once."""

    queue: str
    tid: str
    eid: str
    attempt: int
    name: str
    args: str
    kwargs: str
    max_retries: int
    timeout: float | None
    retries: int
    interruptions: int
    enqueued_ms: int
    priority: int
    idempotency_key: str
    headers: str = ""
    """JSON object of strings set by middleware at enqueue (e.g. a W3C traceparent), or ""."""


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    now_ms: int
    runs: list[Claimed]
    absorbed: int = 0
    expired: int = 0
    paused: bool = False
    missing_streams: bool = False
    held: int = 0  # entries parked by a limit (dtq.limits); no attempt spent
    more: bool = False  # the scan budget ran out with slots free: claim again at once


def claim_call(
    qk: QueueKeys,
    worker_id: str,
    count: int,
    events_maxlen: int,
    ttl_s: int,
    fair: bool = False,
) -> Call:
    return Call(
        "claim",
        list(_claim_keys(qk)),
        [GROUP, worker_id, count, events_maxlen, ttl_s, qk.done_base, 1 if fair else 0],
    )


def parse_claim(queue: str, raw: list[Any]) -> ClaimBatch:
    """claim.lua's reply (also the last element of complete.lua's when it claimed)."""
    now = int(raw[0])
    if int(raw[1]) == -1:
        return ClaimBatch(now, [], paused=True)
    if int(raw[1]) == -2:
        return ClaimBatch(now, [], missing_streams=True)
    absorbed, expired, n = int(raw[1]), int(raw[2]), int(raw[3])
    runs = []
    s = _s
    end = 4 + n * 13
    for b in range(4, end, 13):  # positional, no slice per run (claim is the hot path)
        runs.append(
            Claimed(
                queue, s(raw[b]), s(raw[b + 1]), int(raw[b + 2]), s(raw[b + 3]),
                s(raw[b + 4]), s(raw[b + 5]), int(raw[b + 6]),
                float(raw[b + 7]) if raw[b + 7] else None, int(raw[b + 8]), int(raw[b + 9]),
                int(raw[b + 10]), int(raw[b + 11]), s(raw[b + 12]),
            )
        )  # fmt: skip
    held = int(raw[end]) if len(raw) > end else 0
    more = len(raw) > end + 1 and int(raw[end + 1]) == 1
    for h in range(end + 2, len(raw) - 1, 2):  # headers, only of the runs that have them
        k = int(raw[h])
        runs[k] = replace(runs[k], headers=s(raw[h + 1]))
    return ClaimBatch(now, runs, absorbed=absorbed, expired=expired, held=held, more=more)


# --- outcomes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Success:
    tid: str
    eid: str
    attempt: int
    status: str  # "succeeded" | "cancelled"
    payload: str  # result JSON, or the cancel reason


def complete_call(
    qk: QueueKeys,
    worker_id: str,
    outcomes: Sequence[Success],
    events_maxlen: int,
    ttl_s: int,
    claim: int = 0,
    fair: bool = False,
) -> Call:
    """Store ``outcomes``; then, when ``claim`` > 0, claim up to that many runs (as claim.lua)."""
    args: list[Any] = [
        GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(outcomes), claim,
        1 if fair else 0,
    ]  # fmt: skip
    for o in outcomes:
        args += [o.tid, o.eid, o.attempt, o.status, o.payload]
    return Call("complete", list(_claim_keys(qk)), args)


def parse_complete(raw: list[Any]) -> list[bool]:
    """The fence's verdict per outcome (a claim reply that follows them is left out)."""
    return [int(x) == 1 for x in raw if not isinstance(x, list)]


def parse_complete_claim(queue: str, raw: list[Any]) -> tuple[list[bool], ClaimBatch | None]:
    """complete.lua's reply: verdicts, and the claim batch when the call claimed."""
    if raw and isinstance(raw[-1], list):
        return parse_complete(raw[:-1]), parse_claim(queue, raw[-1])
    return parse_complete(raw), None


@dataclass(frozen=True, slots=True)
class Failure:
    tid: str
    eid: str
    attempt: int
    error: str
    retry_delay_ms: int  # -1: no retry allowed
    traceback: str = ""  # "": none (a kept one is removed: it belonged to an older failure)


def fail_call(
    qk: QueueKeys, worker_id: str, failures: Sequence[Failure], events_maxlen: int, ttl_s: int
) -> Call:
    args: list[Any] = [GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, len(failures)]
    for f in failures:
        args += [f.tid, f.eid, f.attempt, f.error, f.retry_delay_ms]
    args += [f.traceback for f in failures]  # the optional trailing block
    return Call(
        "fail",
        [
            *qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base,
            qk.lim_base, qk.flow_base, qk.flowq,
        ],
        args,
    )  # fmt: skip


def parse_strings(raw: list[Any]) -> list[str]:
    return [_s(x) for x in raw]


@dataclass(frozen=True, slots=True)
class RunRef:
    """Identifies one run: the fencing triple."""

    tid: str
    eid: str
    attempt: int


def requeue_call(
    qk: QueueKeys,
    worker_id: str,
    runs: Sequence[RunRef],
    *,
    events_maxlen: int,
    ttl_s: int,
    max_interruptions: int,
    retry_delay_ms: int,
    started: bool = True,
) -> Call:
    """Hand ``runs`` back; ``started=False`` for runs whose body never began (no interruption
    is counted for them)."""
    args: list[Any] = [
        GROUP, worker_id, events_maxlen, ttl_s, qk.done_base, max_interruptions,
        retry_delay_ms, len(runs), 1 if started else 0,
    ]  # fmt: skip
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    return Call(
        "requeue",
        [
            *qk.streams, qk.sched, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base,
            qk.lim_base, qk.flow_base, qk.flowq,
        ],
        args,
    )  # fmt: skip


def recover_call(
    qk: QueueKeys,
    worker_id: str,
    known: Iterable[tuple[int, str]],
    *,
    events_maxlen: int,
    since_ms: int,
    per_band: int = 1000,
) -> Call:
    """Find this worker's runs whose claim reply was lost (lua/recover.lua); ``known``: the
    (priority, entry id) of every run the worker holds or left unanswered. Its reply is
    claim.lua's: :func:`parse_claim`."""
    args: list[Any] = [GROUP, worker_id, events_maxlen, since_ms, per_band, 0]
    for prio, eid in known:
        args += [prio, eid]
    args[5] = (len(args) - 6) // 2
    return Call("recover", [*qk.streams, qk.events, qk.stats, qk.task_base], args)


# --- reclaim, touch, promote -----------------------------------------------------------------


# XAUTOCLAIM calls one reclaim.lua call makes at most: with the reaper's COUNT (adopted per
# call), one call examines at most RECLAIM_STEPS x 10 x COUNT pending entries.
RECLAIM_STEPS = 10


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    requeued: int
    failed: int
    absorbed: int
    # Where the pass goes on: the band (KEYS index 1..10, p9 first; 0 once the pass is
    # complete) and the cursor in it, for the next call (reclaim_call's ``band``/``cursor``).
    band: int = 0
    cursor: str = "0-0"
    steps: int = 0  # XAUTOCLAIM calls this call made
    cancelled: int = 0  # lost runs whose cancel was requested: ended "cancelled"

    @property
    def more(self) -> bool:
        """The pass is not complete: call again from ``band``/``cursor``."""
        return self.band != 0


def reclaim_call(
    qk: QueueKeys,
    worker_id: str,
    *,
    min_idle_ms: int,
    count: int,
    events_maxlen: int,
    ttl_s: int,
    band: int = 1,
    cursor: str = "0-0",
    steps: int = RECLAIM_STEPS,
) -> Call:
    """One bounded step of a reclaim pass (see reclaim.lua): from ``band``/``cursor`` (a new
    pass by default), at most ``steps`` XAUTOCLAIMs of COUNT ``count``, at most ``count``
    entries adopted."""
    return Call(
        "reclaim",
        [
            *qk.streams, qk.dlq, qk.events, qk.stats, qk.task_base, qk.idem_base, qk.lim_base,
            qk.flow_base, qk.flowq,
        ],
        [
            GROUP, worker_id, min_idle_ms, count, events_maxlen, ttl_s, qk.done_base, band,
            cursor, steps,
        ],
    )  # fmt: skip


def parse_reclaim(raw: list[Any]) -> ReclaimResult:
    return ReclaimResult(
        int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]), _s(raw[4]), int(raw[5]), int(raw[6])
    )


@dataclass(frozen=True, slots=True)
class TouchResult:
    lost: list[str]
    cancel_requested: list[str]


def touch_call(qk: QueueKeys, worker_id: str, runs: Sequence[RunRef]) -> Call:
    args: list[Any] = [GROUP, worker_id, len(runs)]
    for r in runs:
        args += [r.tid, r.eid, r.attempt]
    return Call("touch", [*qk.streams, qk.task_base], args)


def parse_touch(raw: list[Any]) -> TouchResult:
    items = [_s(x) for x in raw]
    cut = items.index("|")
    return TouchResult(items[:cut], items[cut + 1 :])


@dataclass(frozen=True, slots=True)
class PromoteResult:
    promoted: int
    dropped: int
    next_due_ms: int | None


def promote_call(qk: QueueKeys, limit: int, events_maxlen: int) -> Call:
    return Call("promote", [*qk.streams, qk.sched, qk.events, qk.task_base], [limit, events_maxlen])


def parse_promote(raw: list[Any]) -> PromoteResult:
    nxt = int(raw[2])
    return PromoteResult(int(raw[0]), int(raw[1]), None if nxt < 0 else nxt)


# --- cancel, locks ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancelResult:
    outcome: str  # cancelled | requested | unchanged | missing
    status: str


# How long a state-changing SDK call's reply is kept for its re-send (lua/_replay.lua): longer
# than any client's re-send window (DTQ_CLIENT_RETRIES backoffs of at most 1 s, plus timeouts).
REPLY_TTL_MS = 60_000


def new_nonce() -> str:
    """A per-call nonce: the same call re-sent after a blip carries it and gets the first
    send's reply (lua/_replay.lua)."""
    return secrets.token_hex(8)


def cancel_call(
    qk: QueueKeys,
    tid: str,
    *,
    events_maxlen: int,
    ttl_s: int,
    hint_channel: str,
    reason: str,
    nonce: str | None = None,
) -> Call:
    """``nonce``: answer a re-send of this very call with its first reply (see new_nonce)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task(tid), qk.idem_base]
    args: list[Any] = [tid, events_maxlen, ttl_s, qk.done_channel(tid), hint_channel, reason]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq]
        args.append(REPLY_TTL_MS)
    return Call("cancel", keys, args)


def parse_cancel(raw: list[Any]) -> CancelResult:
    return CancelResult(_s(raw[0]), _s(raw[1]))


def limit_sweep_call(qk: QueueKeys, limit_keys: Sequence[str]) -> Call:
    """Release parked tasks of these limit keys (none: the keys owed a release); the reply is
    ``[released, more]``, more = 1 when the call's budget ran out."""
    return Call("limit_sweep", [*qk.streams, qk.task_base, qk.lim_base], list(limit_keys))


def consumer_prune_call(qk: QueueKeys, idle_ms: int) -> Call:
    """Delete the queue's stream consumers idle for idle_ms that hold no pending entry (the
    check and the delete in one step); the reply is the number deleted."""
    return Call("retention_consumers", qk.streams, [GROUP, idle_ms])


def queue_empty_call(qk: QueueKeys, drop: bool) -> Call:
    """1 when the queue holds nothing (lua/retention_queue.lua); with drop, its empty keys go."""
    keys = [*qk.streams, qk.sched, qk.dlq, qk.paused, qk.schedules, qk.lim_parked, qk.events]
    keys += [qk.stats, qk.fair, qk.decl, qk.flowq]
    return Call("retention_queue", keys, [GROUP, 1 if drop else 0])


def lock_call(key: str, token: str, lease_ms: int) -> Call:
    return Call("lock", [key], [token, lease_ms])


def unlock_call(key: str, token: str) -> Call:
    return Call("unlock", [key], [token])


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
