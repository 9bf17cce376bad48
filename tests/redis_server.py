"""Private redis-server processes for the tests: free port, killable, pausable, restartable."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(
        self, port: int | None = None, aof: bool = False, extra_args: Sequence[str] = ()
    ) -> None:
        if not shutil.which("redis-server"):
            raise RuntimeError("redis-server is not on PATH (Debian package redis-server)")
        self.port = port or free_port()
        self.aof = aof
        self.dir = Path(tempfile.mkdtemp(prefix="dtq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = list(extra_args)  # more redis-server options

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, loaded: bool = True) -> RedisServer:
        """Start the server; return once it serves commands (``loaded`` False: once it answers
        at all, ``LOADING`` included, while it still loads its data)."""
        args = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.aof else "no", "--appendfsync", "always",
            "--logfile", str(self.dir / "redis.log"), "--maxclients", "2000",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return self
            except redis.BusyLoadingError:
                if not loaded:
                    return self
                time.sleep(0.02)
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def restart_loading(self, keys: int = 100_000) -> None:
        """Restart the server (its data saved first, with ``keys`` more of ballast) so that it
        loads for as long as the test likes: every command but a few (``CLIENT``, ``CONFIG``,
        ``INFO``) is answered ``LOADING`` until :meth:`finish_loading` (1 ms per key, so at
        most ``keys`` ms)."""
        r = self.client()
        r.mset({f"ballast:{i}": "x" for i in range(keys)})
        r.save()
        r.close()
        self.stop()
        held = ["--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024"]
        self.extra_args += held
        try:
            self.start(loaded=False)
        finally:
            del self.extra_args[-len(held) :]

    def finish_loading(self) -> None:
        """End a load held by :meth:`restart_loading` now; return once commands are served."""
        r = self.client()
        r.config_set("key-load-delay", 0)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        r.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
