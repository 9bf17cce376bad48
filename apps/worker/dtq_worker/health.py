"""The worker's HTTP port (DTQ_METRICS_PORT): ``/metrics``, ``/healthz`` and ``/readyz``, from
a thread of its own (docs/operations.md, the probes' table)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from dtq.errors import ConfigError

# How long /healthz waits for the event loop: above a healthy loop's pauses, below k8s's 5 s.
LOOP_ANSWER_TIMEOUT_S = 2.0

Check = Callable[[], str]  # "ok", or why not
StartResponse = Callable[..., Any]


def loop_answers(loop: asyncio.AbstractEventLoop, timeout: float = LOOP_ANSWER_TIMEOUT_S) -> Check:
    """A liveness check: the loop runs a no-op scheduled from this thread within ``timeout``."""

    def check() -> str:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        try:
            loop.call_soon_threadsafe(done.set_result, None)
        except RuntimeError:  # the loop is closed: the worker has finished
            return "event loop closed"
        try:
            done.result(timeout)
        except concurrent.futures.TimeoutError:
            return "event loop not answering"
        return "ok"

    return check


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no log
        pass


class HealthServer:
    """Serves the registry on /metrics and the two checks on /healthz and /readyz."""

    def __init__(self, registry: CollectorRegistry, live: Check, ready: Check) -> None:
        self._metrics = make_wsgi_app(registry)
        self._checks = {"/healthz": live, "/readyz": ready}
        self._server: _Server | None = None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        check = self._checks.get(environ.get("PATH_INFO", ""))
        if check is None:
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        try:
            word = check()
        except Exception as exc:  # a probe must answer, whatever went wrong
            word = f"check failed: {exc}"
        body = json.dumps({"status": word}).encode()
        code = "200 OK" if word == "ok" else "503 Service Unavailable"
        start_response(
            code, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]

    def start(self, port: int, addr: str = "0.0.0.0") -> None:
        self.bind(port, addr)
        self.serve()

    def bind(self, port: int, addr: str = "0.0.0.0") -> None:
        """Listen on the port (ConfigError when it is taken), not serving it yet."""
        try:
            self._server = make_server(addr, port, self, _Server, handler_class=_QuietHandler)
        except OSError as exc:  # a busy or forbidden port is configuration, not a lost Redis
            raise ConfigError(
                f"DTQ_METRICS_PORT={port}: cannot listen: {exc.strerror or exc}"
            ) from None

    def serve(self) -> None:
        """Answer on the bound port, from a thread of its own."""
        assert self._server is not None, "not bound"
        t = threading.Thread(target=self._server.serve_forever, name="dtq-health", daemon=True)
        t.start()

    def close_in_child(self) -> None:
        """In a forked child: close the inherited listening socket (its thread is not here)."""
        if self._server is not None:
            self._server.socket.close()
            self._server = None

    @property
    def port(self) -> int:
        """The bound port (the kernel's pick when started on port 0)."""
        assert self._server is not None, "not started"
        return int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_note(port: int | None) -> str:
    """Where the start-up line says the metrics and probes are served ('' when they are not)."""
    return "" if port is None else f" metrics=http://0.0.0.0:{port}/metrics (and /healthz, /readyz)"


def served(tasks: Iterable[str]) -> str:
    """The start-up line's task names (their count past 8: `dtq workers --json` lists them)."""
    names = sorted(tasks)
    if len(names) <= 8:
        return "tasks=" + ",".join(names)
    return f"tasks={len(names)} (names: dtq workers --json)"
