"""A private ``redis-server`` for one benchmark run: free port, no persistence, killed at the end.

The benchmark never touches a Redis it did not start (in particular not the system one on 6379).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchRedis:
    """``with BenchRedis() as srv: srv.url``; flushed between workloads with :meth:`flush`."""

    def __init__(
        self, executable: str = "redis-server", *, port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        exe = shutil.which(executable)
        if exe is None:
            raise RuntimeError(f"{executable} is not on PATH (Debian package redis-server)")
        self.exe = exe
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="dtq-bench-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> BenchRedis:
        args = [
            self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--maxclients", "4000",
            "--logfile", str(self.dir / "redis.log"), *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_connect_timeout=0.2) as c:
                    c.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def client(self, decode: bool = True) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=decode)

    def flush(self) -> None:
        with self.client() as c:
            c.flushall()
            c.config_resetstat()

    def version(self) -> str:
        with self.client() as c:
            return str(c.info("server")["redis_version"])

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server used so far."""
        with self.client() as c:
            info = c.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def cpu_by_node(self) -> list[float]:
        return [self.cpu_s()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BenchRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
