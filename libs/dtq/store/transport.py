"""The fast lane: script calls written to a kept connection, under redis-py's command layer
(whose per-call CPU cost: docs/performance.md, "Hand-written code"). Whatever a lane cannot do
goes the usual way (:mod:`dtq.scripts`): a NOSCRIPT, a busy lane, a broken connection.

The only module that touches redis-py's private parts (a test enforces it): :func:`fast_lane`
checks once per process that they are all there (:func:`missing`); if not, or with
``DTQ_FAST_LANE=0``, every call takes redis-py's public path (logged once).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection as AsyncConnection
from redis.exceptions import ConnectionError, DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # the hiredis reader's "no whole reply yet" (redis-py's hiredis parser, 5.x-8.x)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - another redis-py: no lane (see missing())
    _NOT_ENOUGH_DATA = None

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _hiredis_pack = None  # type: ignore[assignment]

log = logging.getLogger("dtq.store.transport")

SETTING = "DTQ_FAST_LANE"
# How long a reply of a pair is still read for once its deadline has passed (AsyncLane.call_pair).
LATE_REPLY_S = 0.5
MAX_ASYNC_LANES = 4  # per AsyncScripts: calls in flight at once beyond this take the usual path
# A lane's answer for "not run here, take the usual path" (a NOSCRIPT, a lane dropped before
# anything could have run).
MISS: Any = object()

T = TypeVar("T")


# --- the decision ------------------------------------------------------------------------------


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - not introspectable: treated as absent
        return set()


def missing() -> list[str]:
    """The redis-py / hiredis parts the lane needs that this install lacks (none: it can run)."""
    gone = []
    if _hiredis_pack is None:
        gone.append("hiredis.pack_command")
    if _NOT_ENOUGH_DATA is None:
        gone.append("redis._parsers.hiredis.NOT_ENOUGH_DATA")
    sync_conn = redis.connection.Connection
    for name in ("_host_error", "send_packed_command", "read_response", "can_read", "disconnect"):
        if not callable(getattr(sync_conn, name, None)):
            gone.append(f"redis.connection.Connection.{name}")
    probe = sync_conn()  # type: ignore[no-untyped-call]  # (not connected: slots exist)
    if not hasattr(probe, "_sock"):
        gone.append("redis.connection.Connection._sock")
    parser = getattr(probe, "_parser", None)
    if type(parser).__name__ == "_HiredisParser" and not hasattr(parser, "_buffer"):
        gone.append("redis._parsers.hiredis._HiredisParser._buffer")
    async_conn = redis.asyncio.Connection
    wanted = {
        "read_response": "disconnect_on_error",
        "send_packed_command": "check_health",
        "disconnect": "nowait",
    }
    for name, param in wanted.items():
        if param not in _params(getattr(async_conn, name, None)):
            gone.append(f"redis.asyncio.Connection.{name}({param}=)")
    if not any(hasattr(async_conn, n) for n in ("can_read", "can_read_destructive")):
        gone.append("redis.asyncio.Connection.can_read")
    if "connection_class" not in _params(redis.asyncio.ConnectionPool):
        gone.append("redis.asyncio.ConnectionPool(connection_class=)")
    return gone


def setting_from_env() -> bool:
    """``DTQ_FAST_LANE`` read as Settings.fast_lane reads it (unset: on)."""
    raw = os.environ.get(SETTING, "").strip().lower()
    return raw not in ("0", "false", "no", "off", "f", "n")


_lock = threading.Lock()
_missing: list[str] | None = None
_told: set[str] = set()
_state: bool | None = None  # the last decision of this process (None: no lane asked for yet)


def fast_lane(setting: bool | None = None) -> bool:
    """Whether calls may take the lane: ``setting`` (None: ``DTQ_FAST_LANE``) and every part it
    needs present. Probed once per process; each reason for "no" is logged once."""
    global _missing, _state
    with _lock:
        if _missing is None:
            _missing = missing()
        on = setting_from_env() if setting is None else setting
        reason = ""
        if not on:
            reason = f"{SETTING}=0: script calls take redis-py's usual path"
        elif _missing:
            reason = (
                f"redis-py {redis.__version__} lacks {', '.join(_missing)}: script calls take "
                f"redis-py's usual path (dtq works the same, with more client CPU per call)"
            )
        if reason and reason not in _told:
            _told.add(reason)
            (log.info if not on else log.warning)("fast lane off: %s", reason)
        _state = not reason
        return _state


def in_use() -> bool | None:
    """The last :func:`fast_lane` decision of this process (None: none made yet)."""
    return _state


# --- packing -----------------------------------------------------------------------------------


def packed(conn: Any, args: Sequence[Any]) -> list[bytes]:
    """``args`` packed for ``conn`` by hiredis directly (pack_command checks each in Python)."""
    if _hiredis_pack is None:  # pragma: no cover - no lane without it (missing())
        return conn.pack_command(*args)  # type: ignore[no-any-return]
    try:
        return [_hiredis_pack(tuple(args))]
    except TypeError as exc:
        raise DataError(str(exc)) from None


class _HiredisPacking:
    """Connection mixin: pack commands with hiredis, as redis-py's sync connections do."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        try:
            return [_hiredis_pack(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from None


def hiredis_packing(client: T, *, setting: bool | None = None) -> T:
    """Make an asyncio ``client``'s new connections pack with hiredis (a no-op without the fast
    lane, or for a client of another kind). Returns ``client``."""
    pool = getattr(client, "connection_pool", None)
    base = getattr(pool, "connection_class", None)
    if pool is None or not isinstance(base, type) or not fast_lane(setting):
        return client
    if issubclass(base, AsyncConnection) and not issubclass(base, _HiredisPacking):
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return client


# --- streaming: many calls on one lane ---------------------------------------------------------


def each_reply(replies: list[Any], each: Callable[[int, Any], None] | None) -> list[Any]:
    """Hand ``replies`` to ``each`` in order (the usual path of a run_many); returns them."""
    if each is not None:
        for k, r in enumerate(replies):
            each(k, r)
    return replies


class Stream:
    """The bookkeeping of one streamed run_many (the sync and async lanes share it)."""

    __slots__ = ("each", "error", "fallback", "replies", "sent", "unsent")

    def __init__(self, each: Callable[[int, Any], None] | None) -> None:
        self.each = each
        self.sent: list[Any] = []
        self.replies: list[Any] = []
        self.error: ResponseError | None = None
        self.unsent: Any = None  # taken from the calls, its send failed: not sent at all
        self.fallback = False  # nothing was sent: every call must go the usual way

    def read(self, reply: Any) -> None:
        """Record a reply (a :class:`ResponseError` instance for an error reply)."""
        if isinstance(reply, NoScriptError):
            reply = MISS
        elif isinstance(reply, ResponseError):
            self.replies.append(None)
            self.error = self.error or reply
            return
        self.replies.append(reply)
        if self.each is not None and reply is not MISS and self.error is None:
            self.each(len(self.replies) - 1, reply)

    @property
    def behind(self) -> int:
        """Calls sent whose reply was not read yet."""
        return len(self.sent) - len(self.replies)

    def rest(self, calls: Iterator[T]) -> Iterator[T]:
        """For the fallback (nothing was sent): every call, the one whose send failed first."""
        return calls if self.unsent is None else itertools.chain([self.unsent], calls)

    def misses(self) -> list[tuple[int, Any]]:
        """Raise the first error reply; else the calls that answered NOSCRIPT (did not run)."""
        if self.error is not None:
            raise self.error
        return [
            (k, c)
            for k, (c, r) in enumerate(zip(self.sent, self.replies, strict=True))
            if r is MISS
        ]

    def rerun(self, k: int, reply: Any) -> None:
        self.replies[k] = reply
        if self.each is not None:
            self.each(k, reply)


# --- the asyncio lane --------------------------------------------------------------------------


class AsyncLane:
    """One connection of an asyncio client's pool, kept and written to directly.

    ``call`` raises whatever the command raised; anything but a Redis error reply drops the
    connection, so no later call can read a reply meant for this one. ``busy`` is for callers
    sharing a lane. With ``fast`` False the connection is used through public methods only.
    """

    def __init__(
        self, client: redis.asyncio.Redis, *, fast: bool | None = None, pool: Any = None
    ) -> None:
        """``pool``: where the connection comes from (``get_connection`` and ``release``,
        awaited; a cluster node's: dtq.cluster), else ``client``'s pool."""
        self._client, self._pool = client, pool
        self._conn: Any = None
        self.busy = False
        self.fast = fast_lane(fast)

    async def connection(self) -> Any:
        if self._conn is None:
            if self._pool is None:
                self._pool = self._client.connection_pool
            self._conn = await self._pool.get_connection()
        return self._conn

    @property
    def connected(self) -> bool:
        """Whether the lane holds a connection (it has sent a call and was not dropped since)."""
        return self._conn is not None

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await (conn.disconnect(nowait=True) if self.fast else conn.disconnect())
            await self._pool.release(conn)

    async def call(self, args: Sequence[Any]) -> Any:
        conn = await self.connection()
        try:
            if self.fast:
                await conn.send_packed_command(packed(conn, args), check_health=False)
            else:
                await conn.send_command(*args)
            return await conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            await self.drop()
            raise

    async def call_pair(
        self, first: Sequence[Any], then: Sequence[Any], timeout: float
    ) -> tuple[Any, Any]:
        """Send two commands in one write and read both replies (an error reply is returned,
        not raised, so the lane stays in step); Redis runs ``then`` right after ``first``.

        Past ``timeout`` the lane is dropped and :class:`TimeoutError` raised. A process frozen
        past it (SIGSTOP) still reads replies already in its socket for :data:`LATE_REPLY_S`,
        so what ``then`` did is not lost (without the fast lane it is: lua/recover.lua).
        """
        conn = await self.connection()
        try:
            if self.fast:
                await conn.send_packed_command(
                    [*packed(conn, first), *packed(conn, then)], check_health=False
                )
            else:
                await conn.send_packed_command(conn.pack_commands([first, then]))
            deadline = asyncio.get_running_loop().time() + timeout
            one = await _read_by(conn, deadline, self.fast)
            return one, await _read_by(conn, deadline, self.fast)
        except BaseException:
            await self.drop()
            raise

    async def stream(
        self, calls: Iterator[T], args_of: Callable[[T], Sequence[Any]], st: Stream
    ) -> None:
        """Send ``calls`` (each packed from ``args_of(call)``) on this lane, reading reply k after
        call k + 1 was sent, every reply into ``st``. A lane found dead before anything was
        sent sets ``st.fallback``; a connection lost after a send raises."""
        try:
            conn = await self.connection()
            # EOF: the server closed the lane meanwhile (can_read: redis-py 8; 5-7 name it so)
            can_read = getattr(conn, "can_read", None) or conn.can_read_destructive
            if await can_read():
                raise ConnectionError("the lane has unread data")

            async def read_one() -> None:
                try:
                    st.read(await conn.read_response())
                except ResponseError as exc:
                    st.read(exc)

            for call in calls:
                st.unsent = call
                await conn.send_packed_command(packed(conn, args_of(call)), check_health=False)
                st.unsent = None
                st.sent.append(call)
                if st.behind > 1:
                    await read_one()
            while st.behind:  # every reply is read: the lane stays in step
                await read_one()
        except ConnectionError:
            await self.drop()
            if st.sent:
                raise
            st.fallback = True
        except BaseException:
            await self.drop()
            raise


async def _read_by(conn: Any, deadline: float, fast: bool) -> Any:
    """One reply of a pair (see :meth:`AsyncLane.call_pair`); an error reply is returned."""
    try:
        if not fast:
            async with asyncio.timeout_at(deadline):
                return await conn.read_response()
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


class AsyncLanes:
    """The lanes of one asyncio client: calls of one process overlap (a worker has two outcome
    writes in flight, a heartbeat, a claim), and each would otherwise take the usual path."""

    def __init__(self, client: redis.asyncio.Redis, pool: Any = None) -> None:
        self._client = client
        self._pool = pool  # (as AsyncLane's)
        self.lanes: list[AsyncLane] = []

    def free(self) -> AsyncLane | None:
        """A lane not busy (made when fewer than MAX_ASYNC_LANES exist), or None."""
        for lane in self.lanes:
            if not lane.busy:
                return lane
        if len(self.lanes) < MAX_ASYNC_LANES:
            lane = AsyncLane(self._client, fast=True, pool=self._pool)
            self.lanes.append(lane)
            return lane
        return None


# --- the blocking lane -------------------------------------------------------------------------

# Forks of this process so far, counted in the child (os.getpid per call is a system call).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def _send(conn: Any, chunks: list[bytes]) -> None:
    """Send a packed command on a blocking connection: one ``write`` for a plain socket (a
    socket with a timeout would ``poll`` first). The rest of a large call, and TLS, go the
    usual way."""
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

    As ``Connection.read_response``: a timeout or socket error drops the connection and raises
    redis-py's TimeoutError / ConnectionError. Every error reply raises, whatever its class
    (``LOADING``, ``NOAUTH`` are ConnectionErrors in redis-py). Other parsers and sockets go
    the usual way.
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
    if isinstance(reply, Exception):  # an error reply, of any kind (see below)
        raise reply
    return reply


class SyncLane:
    """One connection of a blocking client's pool, kept (thread-safe: a caller that finds the
    lane busy goes the usual way; a forked child makes its own)."""

    def __init__(self, client: redis.Redis, *, replay_safe: bool = False) -> None:
        """``replay_safe``: as for :class:`dtq.scripts.SyncScripts`; a call that timed out is
        then answered MISS (the usual path, whose retry policy re-sends it), else raised."""
        self._client = client
        self._replay_safe = replay_safe
        self._conn: Any = None
        self._forks = -1
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        """Whether the lane holds a connection (it has sent a call and was not dropped since)."""
        return self._conn is not None

    def connection(self) -> Any:
        conn = self._conn
        if conn is None or self._forks != _forks:  # a forked child gets its own
            conn = self._conn = self._client.connection_pool.get_connection()
            self._forks = _forks
        return conn

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            self._client.connection_pool.release(conn)

    def call(self, args: Sequence[Any]) -> Any:
        """The reply of the command ``args``; MISS when the lane is busy or the command did not
        run here (NOSCRIPT, or a connection lost: the usual path reconnects and sends again)."""
        if not self._lock.acquire(blocking=False):
            return MISS
        try:
            conn = self.connection()
            try:
                _send(conn, packed(conn, args))
                return _read(conn)
            except NoScriptError:
                return MISS
            except ResponseError:
                raise
            except ConnectionError:
                self.drop()
                return MISS
            except RedisTimeoutError:
                self.drop()
                if self._replay_safe:
                    return MISS
                raise
            except BaseException:
                self.drop()
                raise
        finally:
            self._lock.release()

    def stream(self, calls: Iterator[T], args_of: Callable[[T], Sequence[Any]], st: Stream) -> bool:
        """As :meth:`AsyncLane.stream`; False when the lane is busy (nothing was tried)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            conn = self.connection()

            def read_one() -> None:
                try:
                    st.read(conn.read_response())
                except ResponseError as exc:
                    st.read(exc)

            try:
                # A lane the server closed meanwhile (a restart, an idle timeout) reads as EOF:
                # found before the first send, when the usual path can still run it all.
                if conn.can_read():
                    raise ConnectionError("the lane has unread data")
                for call in calls:
                    st.unsent = call
                    conn.send_packed_command(packed(conn, args_of(call)), False)
                    st.unsent = None
                    st.sent.append(call)
                    if st.behind > 1:
                        read_one()
                while st.behind:  # every reply is read: the lane stays in step
                    read_one()
            except ConnectionError:
                self.drop()
                if st.sent:
                    raise
                st.fallback = True
            except BaseException:
                self.drop()
                raise
        finally:
            self._lock.release()
        return True
