"""A small TCP proxy (asyncio, in a thread of its own) whose links can be cut and restored.

While cut, every open connection is aborted (the worker sees a reset) and new ones are accepted
and closed at once (connection reset on the first read), as when a network path goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Proxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.listen_port, self.target_port, self.host = listen_port, target_port, host
        self.up = True
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="chaos-proxy", daemon=True)

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

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                w.transport.abort()

        with contextlib.suppress(Exception):
            await asyncio.gather(pump(reader, uw), pump(ur, writer))
        self._writers -= {writer, uw}

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
