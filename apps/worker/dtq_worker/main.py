"""``dtq-worker APP``: the worker process's command line (its exit codes: the epilog below)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import click

from dtq import logs
from dtq.app import App, load_app
from dtq.errors import ConfigError, DtqError
from dtq.settings import load_settings
from dtq_worker import poolchild
from dtq_worker.faults import is_transient
from dtq_worker.heartbeat import IdStillHeld
from dtq_worker.worker import EXIT_CONFIG, EXIT_ID_HELD, EXIT_REDIS_LOST, Worker

_early_signals: list[int] = []


@click.command(
    name="dtq-worker",
    help="Run a dtq worker. Settings come from DTQ_* variables; flags override them.\n\n"
    "APP: module:attribute naming a dtq.App (or DTQ_APP).",
    epilog="Exit codes: 0 graceful stop, 1 Redis unreachable past the heartbeat TTL, "
    "2 bad configuration or unimportable APP, 4 worker id still held by a stopping worker.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("app", required=False)
@click.option("--queues", help="comma-separated queues, in order (DTQ_QUEUES)")
@click.option("--concurrency", type=int, help="tasks in flight (DTQ_WORKER_CONCURRENCY)")
@click.option("--prefetch", type=int, help="runs claimed ahead of free slots (DTQ_WORKER_PREFETCH)")
@click.option("--worker-id", help="consumer name (DTQ_WORKER_ID)")
@click.option(
    "--processes",
    type=int,
    help="worker processes under one supervising parent (DTQ_WORKER_PROCESSES)",
)
@click.option(
    "--queue-concurrency",
    help="per-queue caps on this worker, e.g. bulk=4,critical=12 (DTQ_QUEUE_CONCURRENCY)",
)
@click.option(
    "--fair",
    is_flag=True,
    help="weighted selection across priority bands instead of strict priority (DTQ_FAIR)",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="log level of the worker and of its tasks' own loggers (DTQ_LOG_LEVEL)",
)
@click.version_option(package_name="dtq", prog_name="dtq-worker", message="%(prog)s %(version)s")
@click.pass_obj
def cli(argv: list[str], /, **flags: Any) -> None:
    """The command line parsed (``argv`` is what a --processes parent hands its children)."""
    run(argv, SimpleNamespace(**flags))


def hold_signals() -> None:
    """A stop asked for while the app is still importing is honoured once the worker is up (it
    then stops at once, exit 0) instead of killing the process half-started."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda sig, _frame: _early_signals.append(sig))


def forked_child(argv: list[str], unblock: Callable[[], None]) -> None:
    """A forked ``--processes`` child's entry point (poolfork.py): the parent's early signals
    and handlers replaced by the child's before ``unblock()`` lets signals in, then :func:`main`."""
    _early_signals.clear()
    hold_signals()
    unblock()
    main(argv)


def main(argv: list[str] | None = None) -> None:
    hold_signals()
    poolchild.follow_parent()  # a --processes child: stop should the parent die
    args = sys.argv[1:] if argv is None else argv
    cli.main(args=args, prog_name="dtq-worker", obj=args)


# Each flag that stands for a setting: (setting, flag).
FLAGS = (
    ("queues", "--queues"), ("worker_concurrency", "--concurrency"),
    ("worker_prefetch", "--prefetch"), ("worker_id", "--worker-id"),
    ("queue_concurrency", "--queue-concurrency"), ("fair", "--fair"),
    ("worker_processes", "--processes"), ("log_level", "--log-level"),
)  # fmt: skip


def run(argv: list[str], args: SimpleNamespace) -> None:
    """Start the worker (or the --processes pool) as the flags and DTQ_* settings say."""
    given = {k: getattr(args, flag[2:].replace("-", "_")) for k, flag in FLAGS}
    overrides: dict[str, Any] = {
        k: v for k, v in given.items() if v is not None and v != "" and v is not False
    }
    try:
        settings = load_settings({k: f for k, f in FLAGS if k in overrides}, **overrides)
        spec = args.app or os.environ.get("DTQ_APP")
        if not spec:
            raise ConfigError("no APP given (pass module:attribute or set DTQ_APP)")
        logs.setup(settings.log_format, settings.log_level, tasks=True)
        app = load_app(spec)
        app.configure(settings)
        app.hooks()  # middleware and tracing (DTQ_TRACING without dtq[otel]: one line, exit 2)
        if settings.worker_processes > 1:
            from dtq_worker import pool

            pool.child_ids(settings, settings.worker_processes)  # ids no child could take
    except ConfigError as exc:
        print(f"dtq-worker: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    # What exists now lives as long as the process (and is shared with forked children): out of
    # the collector's generations.
    gc.freeze()
    if settings.worker_processes > 1:
        code = pool.run_pool(settings, argv, _early_signals, forked_child)
        logging.shutdown()
        sys.exit(code)
    code = run_worker(app)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    alive = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if alive:
        os._exit(code)  # detached task threads must not hold the process open
    sys.exit(code)


def run_worker(app: App) -> int:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        runner = asyncio.run

    async def go() -> int:
        worker = Worker(app, app.settings)  # (--queue-concurrency: in the settings)
        worker.owns_process()
        worker.install_signals()
        for sig in _early_signals:
            worker.on_signal(sig)
        return await worker.run()

    try:
        return int(runner(go()))
    except (DtqError, IdStillHeld) as exc:
        print(f"dtq-worker: {exc}", file=sys.stderr)
        return EXIT_ID_HELD if isinstance(exc, IdStillHeld) else EXIT_CONFIG
    except Exception as exc:
        if is_transient(exc):
            print(
                f"dtq-worker: Redis unreachable: {exc} (is Redis running? DTQ_REDIS_URL "
                "says where it is)",
                file=sys.stderr,
            )
            return EXIT_REDIS_LOST
        raise
