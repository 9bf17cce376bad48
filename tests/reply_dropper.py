"""A TCP proxy for one-packet connection blips, armed for the next request holding some bytes.

Two faults, each fired once and then disarmed:

- :meth:`ReplyDropper.reset_request`: the request is never forwarded; both sides of that link
  are reset (the call did not run; the client sees a reset).
- :meth:`ReplyDropper.drop_reply`: the request is forwarded, Redis runs it, and the link is
  reset when the reply comes back, before any byte of it reaches the client (the call ran; the
  client cannot know).
- :meth:`ReplyDropper.swallow_reply`: as drop_reply, but the link stays open and silent (the
  client waits for its reply until its socket timeout).

Runs an asyncio loop in a thread of its own; :attr:`fired` counts the faults injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class ReplyDropper:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.listen_port, self.target_port, self.host = listen_port, target_port, host
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="reply-dropper", daemon=True)
        self._lock = threading.Lock()
        self._match: bytes | None = None
        self._mode = ""
        self.fired = 0
        self.fired_event = threading.Event()
        self._links: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.listen_port}/0"

    def start(self) -> ReplyDropper:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            for w in list(self._links):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def reset_request(self, match: bytes) -> None:
        """Reset the link that next sends a request containing ``match``, unforwarded."""
        self._arm(match, "reset")

    def drop_reply(self, match: bytes) -> None:
        """Forward the next request containing ``match``; reset the link instead of its reply."""
        self._arm(match, "drop")

    def swallow_reply(self, match: bytes) -> None:
        """Forward the next request containing ``match``; never deliver its reply."""
        self._arm(match, "swallow")

    def _arm(self, match: bytes, mode: str) -> None:
        with self._lock:
            self._match, self._mode = match, mode
            self.fired_event.clear()

    def _take(self, data: bytes) -> str:
        """The fault this request triggers ('' for none); disarms once taken."""
        with self._lock:
            if self._match is None or self._match not in data:
                return ""
            mode, self._match = self._mode, None
            return mode

    def _fire(self) -> None:
        self.fired += 1
        self.fired_event.set()

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
            self._loop.run_until_complete(server.wait_closed())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        dropping = asyncio.Event()  # set: the next reply bytes reset the link instead
        swallowing = asyncio.Event()  # set: replies are never delivered on this link
        self._links |= {writer, uw}

        def reset() -> None:
            writer.transport.abort()
            uw.transport.abort()

        async def upstream() -> None:
            try:
                while data := await reader.read(65536):
                    fault = self._take(data)
                    if fault == "reset":
                        self._fire()
                        reset()
                        return
                    if fault == "drop":
                        dropping.set()
                    elif fault == "swallow":
                        swallowing.set()
                    uw.write(data)
                    await uw.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                uw.transport.abort()

        async def downstream() -> None:
            try:
                while data := await ur.read(65536):
                    if swallowing.is_set():
                        if not self.fired_event.is_set():
                            self._fire()
                        continue
                    if dropping.is_set():
                        self._fire()
                        reset()
                        return
                    writer.write(data)
                    await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.transport.abort()

        try:
            with contextlib.suppress(Exception):
                await asyncio.gather(upstream(), downstream())
        finally:
            self._links -= {writer, uw}
