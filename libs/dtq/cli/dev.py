"""``dtq dev``: a private Redis (or fakeredis), a worker of :mod:`dtq.examples` and, with the
``api`` extra, ``dtq-api``; it enqueues a mix of work, shows each task's end and stops what it
started, never touching the user's data (docs/operations.md, "`dtq dev` and your data").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import redis

from dtq.cli.common import table
from dtq.errors import DtqError
from dtq.models import TaskHandle, TaskStatus
from dtq.sdk.client import Client
from dtq.settings import Settings, load_settings

# The key prefix of the demo on a Redis given with --redis-url (the private one uses dtq's).
DEV_PREFIX = "dtq-dev"
# The user's DTQ_ settings the demo's processes keep (how they log, how fast they retry).
_LOGGING = ("DTQ_LOG_LEVEL", "DTQ_LOG_FORMAT")
PASSED = (*_LOGGING, "DTQ_RETRY_BACKOFF_S", "DTQ_HEARTBEAT_INTERVAL_S", "DTQ_VISIBILITY_TIMEOUT_S")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ping(url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 10
    with redis.Redis.from_url(url, socket_connect_timeout=0.2) as r:
        while True:
            try:
                r.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                    raise DtqError(f"the Redis at {url} did not come up") from None
                time.sleep(0.05)


@contextmanager
def redis_for_dev(say: Any, given: str | None = None) -> Iterator[str]:
    """Yield a Redis URL: ``given`` (--redis-url), a private redis-server, or a fakeredis
    server. DTQ_REDIS_URL is never used."""
    if given:
        say(f"using the Redis at {given} (--redis-url), under the key prefix {DEV_PREFIX!r}")
        _wait_ping(given)
        yield given
        return
    if os.environ.get("DTQ_REDIS_URL"):
        say(
            "DTQ_REDIS_URL is not used: the demo runs on a Redis of its own (--redis-url runs "
            "it on another, under a key prefix of its own)"
        )
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    exe = shutil.which("redis-server")
    if exe:
        tmp = tempfile.mkdtemp(prefix="dtq-dev-")
        flags = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(
            [exe, *flags, "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_ping(url, proc)
            say(f"started a private redis-server on {url}")
            yield url
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        from fakeredis import TcpFakeServer
    except ImportError:  # the `testing` extra
        raise DtqError(
            "redis-server is not installed, nor is fakeredis: install redis-server, "
            "or pip install 'dtq[testing]'"
        ) from None

    say("redis-server is not installed: using an in-process fakeredis server instead")
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _wait_ping(url)
        yield url
    finally:
        server.shutdown()
        server.server_close()


def _mix(c: Client) -> list[tuple[str, TaskHandle]]:
    out = [(f"add {i}+{i}", c.enqueue("examples.add", [i, i])) for i in range(3)]
    for name in ("cat.png", "dog.png"):
        out.append((f"resize {name} (sync, p2)", c.enqueue("examples.resize", [name, 640])))
    out.append(("urgent (p9)", c.enqueue("examples.urgent", ["pay the invoice"])))
    out.append(("add 20+22, delayed 2s", c.enqueue("examples.add", [20, 22], delay=2)))
    out.append(("flaky: fails twice, retries", c.enqueue("examples.flaky", [3])))
    out.append(("reject: dtq.Fail -> DLQ", c.enqueue("examples.reject", ["A-17"])))
    bulk = c.enqueue_many([{"name": "examples.add", "args": [i, 100]} for i in range(5)])
    out += [(f"bulk add {i}+100", h) for i, h in enumerate(bulk)]
    return out


def _table(c: Client, handles: list[tuple[str, TaskHandle]]) -> None:
    rows = []
    for label, h in handles:
        info = c.get(h.id)
        detail = repr(info.result) if info.status == TaskStatus.SUCCEEDED else (info.error or "")
        rows.append((label, info.status.value, info.attempt, h.id, detail[:60]))
    table(rows, ["task", "status", "attempts", "id", "result / error"])


def _reach(url: str, prefix: str, api: bool) -> str:
    """How to look at the running demo from another terminal."""
    pre = "" if prefix == "dtq" else f"    export DTQ_KEY_PREFIX={prefix}\n"
    flags = f"--redis-url {url}" + ("" if prefix == "dtq" else f" --prefix {prefix}")
    return (
        f"Redis at {url}; worker running{' and the dashboard' if api else ''}. From another "
        f"terminal, point dtq at it:\n    export DTQ_REDIS_URL={url}\n{pre}"
        f"    dtq queues      # or: dtq {flags} queues\n"
        "    dtq task <id>   # an id from the table above\nCtrl-C to stop."
    )


def _start_api(env: dict[str, str], port: int | None, say: Any) -> subprocess.Popen[bytes] | None:
    """Start ``dtq-api`` (dashboard at /) when its extra is installed; None otherwise."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "dtq_api")):
        say("dtq-api not installed (pip install 'dtq[api]'): running without the dashboard")
        return None
    port = port or _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtq_api", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    import urllib.request

    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            say(f"dashboard and API on http://127.0.0.1:{port}/")
            return proc
        except OSError:
            time.sleep(0.1)
    say("dtq-api did not come up: running without the dashboard")
    if proc.poll() is None:
        proc.kill()
    return None


def _stop(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    """SIGTERM, then SIGKILL past ``wait_s``."""
    if proc.poll() is None:
        proc.terminate()  # (SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def dev_env(url: str, prefix: str) -> dict[str, str]:
    """The environment of the demo's processes: the user's without their DTQ_ settings (but
    :data:`PASSED`), with the demo's Redis and key prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_") or k in PASSED}
    demo = dict(
        DTQ_RETRY_BACKOFF_S="0.5", DTQ_HEARTBEAT_INTERVAL_S="1", DTQ_VISIBILITY_TIMEOUT_S="10"
    )
    return {**demo, **env, "DTQ_REDIS_URL": url, "DTQ_KEY_PREFIX": prefix}


def _settings_in(env: dict[str, str]) -> Settings:
    """Settings read from ``env`` instead of this process's environment."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(keep: bool, timeout: float, api_port: int | None, redis_url: str | None) -> int:
    def say(msg: str) -> None:
        print(f"dtq dev: {msg}", flush=True)

    with redis_for_dev(say, redis_url) as url:
        env = dev_env(url, DEV_PREFIX if redis_url else "dtq")
        worker = subprocess.Popen(
            [sys.executable, "-m", "dtq_worker", "dtq.examples:app", "--concurrency", "8"], env=env
        )
        say(f"started a worker (pid {worker.pid}) running dtq.examples")
        api = _start_api(env, api_port, say)
        try:
            with Client(settings=_settings_in(env)) as c:
                handles = _mix(c)
                say(f"enqueued {len(handles)} tasks; waiting for them to finish")
                deadline = time.monotonic() + timeout
                for _, h in handles:
                    with contextlib.suppress(DtqError):  # a failed task is part of the show
                        c.result(h.id, timeout=max(0.1, deadline - time.monotonic()))
                _table(c, handles)
                ok = all(c.get(h.id).status.terminal for _, h in handles)
                if keep:
                    say(_reach(url, env["DTQ_KEY_PREFIX"], api is not None))
                    with contextlib.suppress(KeyboardInterrupt):
                        while worker.poll() is None:
                            time.sleep(0.5)
            return 0 if ok else 1
        finally:
            if api is not None:
                _stop(api, 10)
            _stop(worker, 30)
            say("stopped the worker" + ("" if redis_url else " and Redis"))


@click.command(
    name="dtq dev",
    help="Run the whole system on one machine with no setup.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--keep", is_flag=True, help="keep Redis and the worker running")
@click.option("--timeout", type=float, default=60.0, help="seconds to wait for the tasks")
@click.option("--api-port", type=int, help="port of dtq-api (default: a free port)")
@click.option(
    "--redis-url",
    help=f"run on this Redis, under the key prefix {DEV_PREFIX!r} (default: a private Redis; "
    "DTQ_REDIS_URL is not used)",
)
def cli(keep: bool, timeout: float, api_port: int | None, redis_url: str | None) -> None:
    try:
        sys.exit(run(keep, timeout, api_port, redis_url))
    except DtqError as exc:
        print(f"dtq dev: {exc}", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="dtq dev")


if __name__ == "__main__":
    main()
