"""``dtq-api [--host H] [--port P]``: serve the HTTP API, the dashboard and ``/metrics``.

Exit codes: 0 after a graceful stop, 2 for a bad setting or option, or a port it cannot bind.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys

import click

from dtq import logs
from dtq.app import load_app
from dtq.errors import ConfigError
from dtq.settings import load_settings

log = logging.getLogger("dtq.api")
MISSING_EXTRA = "dtq-api: the HTTP API needs the 'api' extra: pip install 'dtq[api]' ({})"


def require_api_extra() -> None:
    """Exit 2 with one line naming the extra to install when FastAPI or uvicorn is missing.

    Checked before parsing the command line, so even ``--help`` says it, not a traceback.
    """
    for module in ("fastapi", "uvicorn"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(MISSING_EXTRA.format(f"{exc.name or module} is not installed"), file=sys.stderr)
            sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    require_api_extra()
    cli.main(args=argv, prog_name="dtq-api")


@click.command(
    name="dtq-api",
    help="Serve the dtq HTTP API (/api/v1), the dashboard (/) and /metrics. "
    "Settings come from DTQ_* variables (DTQ_REDIS_URL, DTQ_KEY_PREFIX, DTQ_API_TOKEN, "
    "DTQ_LOG_FORMAT, ...).",
    epilog="Exit codes: 0 graceful stop, 2 bad configuration or a port that cannot be bound "
    "(in use, or not permitted).",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
@click.option("--port", type=int, default=8000, help="port (default 8000)")
@click.option(
    "--insecure",
    is_flag=True,
    help="allow binding beyond loopback without DTQ_API_TOKEN (anyone who reaches the "
    "port may pause, purge and cancel)",
)
@click.option(
    "--app",
    help="module:attribute naming your dtq.App (or DTQ_APP): HTTP enqueues then get each "
    "task's declared defaults and limits",
)
@click.version_option(package_name="dtq", prog_name="dtq-api", message="%(prog)s %(version)s")
def cli(host: str, port: int, insecure: bool, app: str | None) -> None:
    """Check the settings and the bind address, then run uvicorn until stopped."""
    import uvicorn

    from dtq_api.app import create_app
    from dtq_api.guard import is_loopback

    try:
        settings = load_settings()
        spec = app or os.environ.get("DTQ_APP")
        tasks_app = load_app(spec) if spec else None
        if tasks_app is not None:
            tasks_app.configure(settings)
    except ConfigError as exc:
        print(f"dtq-api: {exc}", file=sys.stderr)
        sys.exit(2)
    if not 0 <= port <= 65535:
        print("dtq-api: --port must be 0-65535", file=sys.stderr)
        sys.exit(2)
    if not settings.api_token and not is_loopback(host) and not insecure:
        print(
            f"dtq-api: refusing to serve {host} without DTQ_API_TOKEN (anyone reaching "
            "it could pause, purge and cancel); set a token, bind 127.0.0.1, or pass "
            "--insecure",
            file=sys.stderr,
        )
        sys.exit(2)
    busy = cannot_bind(host, port)
    if busy:
        print(f"dtq-api: cannot listen on {host}:{port}: {busy}", file=sys.stderr)
        sys.exit(2)
    logs.setup(settings.log_format, settings.log_level)
    auth = "on" if settings.api_token else "off"
    log.info("dtq-api on http://%s:%d (prefix %s, auth %s)", host, port, settings.key_prefix, auth)
    if not settings.api_token:
        log.warning(
            "auth is off (DTQ_API_TOKEN unset): every local process and user can "
            "change queues and tasks through %s:%d",
            host,
            port,
        )
    uvicorn.run(
        create_app(settings, tasks_app, bind_host=host),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


def cannot_bind(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, not permitted, no such address), or
    None. Checked before uvicorn starts, so a busy port is one line and exit 2, not a log
    record and exit 1; the port is free again at once (SO_REUSEADDR, as uvicorn binds)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


if __name__ == "__main__":
    main()
