"""The tests' one TCP proxy (asyncio, in a thread of its own) in front of a redis-server: links
cut and restored, and one-shot faults on the next command that matches.

While cut, every open connection is aborted (the worker sees a reset) and new ones are accepted
and closed at once (connection reset on the first read), as when a network path goes away.

A reply can also be lost or held back on its way from Redis (:meth:`Proxy.drop_reply_when`,
:meth:`Proxy.hold_reply_when`): the command reaches Redis and runs, and the client never gets
its answer (the link is aborted instead), or gets it only when released. For one-packet blips
at the SDK (the next request holding some bytes; :attr:`Proxy.fired` counts them):
:meth:`Proxy.reset_request` (never forwarded, both sides reset: the call did not run),
:meth:`Proxy.drop_reply` (forwarded, the link reset at the first byte of the reply: the call ran,
the client cannot know), :meth:`Proxy.swallow_reply` (forwarded, the link stays open and silent:
the client waits until its socket timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# How long a dropped reply's link keeps swallowing what Redis sends before it is aborted: the
# replies of commands written together (a pipeline, the idle XREAD and its claim) all go.
DROP_LINGER_S = 0.1


@dataclass(eq=False)
class ReplyRule:
    """One-shot: the first chunk a client sends that ``match`` accepts arms its link; the replies
    Redis then sends on that link are dropped (``hold=False``) or held until released.
    ``mode`` "reset": the chunk is not forwarded, the link is reset; "swallow": the replies are
    never delivered, the link stays open. ``linger``: how long a dropped reply's link keeps
    swallowing before it is aborted."""

    match: Callable[[bytes], bool]
    hold: bool = False
    mode: str = "drop"  # drop | hold | reset | swallow
    linger: float = DROP_LINGER_S
    matched: threading.Event = field(default_factory=threading.Event)  # the command went out
    fired: threading.Event = field(default_factory=threading.Event)  # a reply was dropped/held
    released: threading.Event = field(default_factory=threading.Event)


class Proxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.listen_port, self.target_port, self.host = listen_port, target_port, host
        self.up = True
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._rule: ReplyRule | None = None
        self.replies_dropped = 0
        self.fired = 0  # faults injected by reset_request, drop_reply and swallow_reply
        self._thread = threading.Thread(target=self._main, name="chaos-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.listen_port}/0"

    def start(self) -> Proxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, self.host, self.listen_port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.transport.abort()
            return
        try:
            ur, uw = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, uw}

        armed: list[ReplyRule] = []  # the rule this link's client command matched

        async def up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            tail = b""  # so a marker split across two reads still matches
            try:
                while data := await r.read(65536):
                    rule = self._rule
                    if rule is not None and not armed and rule.match(tail + data):
                        self._rule = None
                        rule.matched.set()
                        if rule.mode == "reset":  # never forwarded: both sides reset
                            rule.fired.set()
                            self.fired += 1
                            writer.transport.abort()
                            w.transport.abort()
                            return
                        armed.append(rule)
                    tail = data[-128:]
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                w.transport.abort()

        async def down(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    if armed:
                        rule = armed.pop()
                        rule.fired.set()
                        if rule.mode == "swallow":  # open and silent from now on
                            self.fired += 1
                            while await r.read(65536):
                                pass
                            break
                        if not rule.hold:
                            if rule.linger > 0:
                                await self._swallow(r, rule.linger)
                            else:
                                self.fired += 1
                            self.replies_dropped += 1
                            uw.transport.abort()
                            break
                        while not rule.released.is_set() and not w.transport.is_closing():
                            await asyncio.sleep(0.005)
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                w.transport.abort()

        with contextlib.suppress(Exception):
            await asyncio.gather(up(reader, uw), down(ur, writer))
        self._writers -= {writer, uw}

    @staticmethod
    async def _swallow(r: asyncio.StreamReader, linger: float) -> None:
        end = time.monotonic() + linger
        with contextlib.suppress(TimeoutError, OSError):
            while (left := end - time.monotonic()) > 0:
                async with asyncio.timeout(left):
                    if not await r.read(65536):
                        return

    def drop_reply_when(self, match: Callable[[bytes], bool]) -> ReplyRule:
        """Lose the reply of the next command ``match`` accepts (bytes as the client sent
        them): Redis runs it, then the link is aborted instead of answering."""
        rule = self._rule = ReplyRule(match)
        return rule

    def hold_reply_when(self, match: Callable[[bytes], bool]) -> ReplyRule:
        """Hold back the reply of the next command ``match`` accepts until
        ``rule.released.set()`` (Redis has run it meanwhile)."""
        rule = self._rule = ReplyRule(match, hold=True)
        return rule

    def reset_request(self, match: bytes) -> ReplyRule:
        """Reset the link that next sends a request containing ``match``, unforwarded."""
        rule = self._rule = ReplyRule(lambda data: match in data, mode="reset")
        return rule

    def drop_reply(self, match: bytes) -> ReplyRule:
        """Forward the next request containing ``match``; reset the link instead of its reply
        (at its first byte: nothing of it reaches the client)."""
        rule = self._rule = ReplyRule(lambda data: match in data, linger=0)
        return rule

    def swallow_reply(self, match: bytes) -> ReplyRule:
        """Forward the next request containing ``match``; never deliver its reply."""
        rule = self._rule = ReplyRule(lambda data: match in data, mode="swallow")
        return rule

    def clear_rule(self, rule: ReplyRule) -> None:
        """Disarm ``rule`` if no command matched it yet."""
        if self._rule is rule:
            self._rule = None

    def _cut(self) -> None:
        self.up = False
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        """Abort every link and refuse new ones until :meth:`restore`."""
        self._loop.call_soon_threadsafe(self._cut)

    def restore(self) -> None:
        self.up = True

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._cut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
