"""``dtq``: the admin command line. Every command goes through :mod:`dtq.admin` / the SDK.
Human tables by default, ``--json`` for scripts; the exit codes are :data:`EPILOG`'s.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import redis

from dtq.admin import Admin
from dtq.cli.common import (
    EPILOG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REDIS,
    EXIT_USAGE,
    Failed,
    age,
    clip,
    confirm,
    cursor_option,
    echo,
    emit,
    json_option,
    run_admin,
    short_time,
    show_page,
    table,
    zoned_time,
)
from dtq.cli.dlq import dlq
from dtq.cli.queues import groups, pause, purge, queues, resume
from dtq.errors import (
    ConfigError,
    DtqError,
    InvalidRequest,
    RedisUnavailable,
    UndeclaredTaskWarning,
)
from dtq.sdk.client import CANCEL_REASON
from dtq.workflows import render_tree


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dtq", prog_name="dtq", message="%(prog)s %(version)s")
@click.option("--redis-url", envvar="DTQ_REDIS_URL", help="Redis URL (DTQ_REDIS_URL).")
@click.option("--prefix", envvar="DTQ_KEY_PREFIX", help="Key prefix (DTQ_KEY_PREFIX).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (any command).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, prefix: str | None, as_json: bool) -> None:
    """Operate a dtq deployment: tasks, queues, workers, dead letters, schedules."""
    ctx.obj = {"redis_url": redis_url, "key_prefix": prefix}  # (settings overrides)


for command in (dlq, queues, pause, resume, purge, groups):
    cli.add_command(command)


# --- tasks -----------------------------------------------------------------------------------


def _expires(value: str | None) -> float | datetime | None:
    """``--expires``: seconds from now, or an ISO 8601 time with its zone."""
    if value is None:
        return None
    with contextlib.suppress(ValueError):  # (else a time)
        return float(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter("seconds, or an ISO 8601 time", param_hint="--expires") from None
    if when.tzinfo is None:
        raise click.BadParameter("give the time's zone, e.g. +00:00", param_hint="--expires")
    return when


def _json_or_text(value: str) -> Any:
    """A positional VALUE of `dtq enqueue`: its JSON value when it parses, else the string."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _json_arg(value: str | None, what: str, kind: type, wanted: str) -> Any:
    """Option ``what``'s JSON value, a ``kind`` (said as ``wanted``); None when unset."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("nested deeper than Python can read", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be {wanted}", param_hint=what)
    return parsed


@cli.command(epilog=EPILOG)
@click.argument("name")
@click.argument("values", nargs=-1)
@click.option("--args", "args_json", help="Positional arguments as a JSON list, e.g. '[1, \"a\"]'.")
@click.option("--kwargs", "kwargs_json", help="Keyword arguments as a JSON object.")
@click.option("--queue", "-q", help="Queue (default: 'default').")
@click.option("--priority", "-p", type=click.IntRange(0, 9), help="0-9, 9 served first.")
@click.option("--delay", type=float, help="Seconds to wait before it may run.")
@click.option("--eta", help="ISO 8601 time (with zone) before which it does not run.")
@click.option("--max-retries", type=click.IntRange(0), help="Retry budget.")
@click.option("--timeout", type=float, help="Seconds a run may take.")
@click.option("--idempotency-key", help="Return the existing task enqueued with this key.")
@click.option(
    "--expires",
    help="Seconds from now, or an ISO 8601 time (with zone), by which a "
    "run must start; else it ends expired.",
)
@click.option("--metadata", "metadata_json", help="A JSON object kept with the task.")
@click.option(
    "--unique",
    is_flag=True,
    default=None,
    help="While a task of NAME with these arguments is unfinished, return it instead.",
)
@click.option(
    "--partition-key",
    help="Of a partitioned queue: tasks with one key go to one partition (DTQ_QUEUE_PARTITIONS).",
)
@click.option("--group", help="The task's fair group within its queue (a tenant).")
@json_option
def enqueue(
    name: str,
    values: tuple[str, ...],
    args_json: str | None,
    kwargs_json: str | None,
    expires: str | None,
    metadata_json: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Enqueue task NAME with positional arguments VALUES (each read as JSON when it is JSON,
    else as a string: `dtq enqueue add 1 2`, `dtq enqueue greet ada`), or --args. Retry
    budget, timeout and expiry left out come from the task's declaration in the worker
    (``@app.task``).

    Warns (on stderr) when no live worker of the queue declares NAME: such a task waits, and
    fails on the worker that takes it.
    """
    args = _json_arg(args_json, "--args", list, "a JSON list, e.g. '[1, \"a\"]'")
    if values:
        if args is not None:
            raise click.UsageError("give the arguments as VALUES or as --args, not both")
        args = [_json_or_text(v) for v in values]
    kwargs = _json_arg(kwargs_json, "--kwargs", dict, "a JSON object")
    metadata = _json_arg(metadata_json, "--metadata", dict, "a JSON object")
    expiry = _expires(expires)

    # The client's own check (UndeclaredTaskWarning), said on stderr as a line of ours.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UndeclaredTaskWarning)
        # options: the enqueue options named as the client names them (queue, priority, ...)
        h = run_admin(
            lambda a: a.client.enqueue(
                name, args, kwargs, expires=expiry, metadata=metadata, **options
            )
        )
    for w in caught:
        if w.category is UndeclaredTaskWarning:
            echo(f"warning: {w.message}", err=True)
    data = {"id": h.id, "queue": h.queue, "status": h.status.value, "created": h.created}
    existing = "" if h.created else " (existing)"
    emit(data, as_json, lambda: echo(f"{h.id} {h.status.value}{existing}"))


# What `dtq task` leaves out for a workflow: its steps have these, the workflow does not.
_RUN_FIELDS = ("priority", "attempt", "failures", "retries_left", "timeout", "requeues")
FLOW_OMITS = frozenset((*_RUN_FIELDS, "worker_id", "defaults"))


@cli.command(epilog=EPILOG)
@click.argument("task_id")
@click.option("--history/--no-history", default=True, help="Show the task's lifecycle events.")
@json_option
def task(task_id: str, history: bool, as_json: bool) -> None:
    """Show one task: arguments, status, attempts, result or error, history."""

    async def go(a: Admin) -> dict[str, Any]:
        return await a.get_task(await a.resolve_id(task_id), history=history)

    d = run_admin(go)
    flow = d.get("tree") is not None  # a workflow: no attempt, retries or timeout of its own

    def human() -> None:
        head = ("id", "name", "queue", "group", "status", "priority", "attempt", "failures")
        tail = ("retries_left", "timeout", "expires_at", "defaults", "requeues", "worker_id")
        for k in (*head, *tail, "enqueued_at", "started_at", "finished_at", "due_at"):
            if flow and k in FLOW_OMITS:
                continue
            if k == "retries_left":
                echo(f"{'retries left':>12}: {d[k]} of {d['max_retries']}")
            elif d.get(k) not in (None, ""):
                echo(f"{k:>12}: {d[k]}")
        echo(f"{'args':>12}: {json.dumps(d['args'])}")
        if d.get("kwargs"):
            echo(f"{'kwargs':>12}: {json.dumps(d['kwargs'])}")
        if d.get("result") is not None:
            echo(f"{'result':>12}: {json.dumps(d['result'])}")
        if d.get("error"):
            echo(f"{'error':>12}: {d['error']}")
        if d.get("traceback"):
            echo("traceback:")
            for line in d["traceback"].rstrip().splitlines():
                echo(f"  {line}")
        if flow:  # its shape and each step's status
            echo("steps:")
            for line in render_tree(d["tree"], d["steps"]):
                echo("  " + line)
        if history:
            echo("history:")
            for e in d.get("history", []):
                attempt = f" attempt {e['attempt']}" if e.get("attempt") else ""
                worker = f" on {e['worker']}" if e.get("worker") else ""
                detail = f" ({clip(e['detail'])})" if e.get("detail") else ""
                echo(f"  {short_time(e['ts'])} {e['type']}{attempt}{worker}{detail}")

    emit(d, as_json, human)


@cli.command(epilog=EPILOG)
@click.option("--queue", "-q", help="Only this queue.")
@click.option("--status", "-s", help="Only this status (queued, running, failed, ...).")
@click.option("--name", "-n", help="Only tasks of this name.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@cursor_option
@json_option
def tasks(
    queue: str | None,
    status: str | None,
    name: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List tasks (a SCAN over task records: cost grows with the number kept)."""
    show_page(
        lambda a, cur, n: a.list_tasks(queue=queue, status=status, name=name, cursor=cur, limit=n),
        cursor,
        limit,
        as_json,
        ["id", "name", "status", "attempt", "enqueued", "error"],
        lambda t: (t["id"], t["name"], t["status"], t["attempt"], short_time(t["enqueued_at"]),
                   clip(t["error"], 40)),
    )  # fmt: skip


@cli.command(epilog=EPILOG)
@click.argument("task_ids", nargs=-1)
@click.option("--reason", "-r", help="Recorded as the cancelled task's error.")
@click.option("--queue", "-q", help="Bulk: every unfinished task of this queue.")
@click.option("--name", "-n", help="Bulk: every unfinished task of this name.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (bulk form).")
@json_option
def cancel(
    task_ids: tuple[str, ...],
    reason: str | None,
    queue: str | None,
    name: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Cancel tasks: TASK_IDS, or every unfinished one of --queue and/or --name.

    A queued or scheduled task ends cancelled at once; a running one is asked to stop.
    """
    why = reason or CANCEL_REASON
    if task_ids and (queue or name):
        raise click.UsageError("give task ids, or --queue/--name, not both")
    if not task_ids and not (queue or name):
        raise click.UsageError("give task ids, or --queue and/or --name")
    if not task_ids:
        what = " ".join(f"{k}={v}" for k, v in (("queue", queue), ("name", name)) if v)
        confirm(f"Cancel every unfinished task matching {what}?", yes)
        summary = run_admin(lambda a: a.client.cancel_many(queue=queue, name=name, reason=why))
        done = f"cancelled {summary.cancelled}, asked {summary.requested} running ones to stop"
        emit(summary.to_dict(), as_json, lambda: echo(done))
        return

    async def go(a: Admin) -> list[dict[str, Any]]:
        return [await a.cancel(await a.resolve_id(t), reason=why) for t in task_ids]

    results = run_admin(go)

    def human() -> None:
        for d in results:
            echo(f"{d['id']}: {d['outcome']} ({d['status']})")

    emit(results[0] if len(results) == 1 else results, as_json, human)
    ended = [d for d in results if d["outcome"] == "unchanged"]
    if ended:
        raise Failed(", ".join(f"task {d['id']} already ended {d['status']}" for d in ended))


@cli.command(epilog=EPILOG)
@click.argument("task_id")
@click.option("--max-retries", type=click.IntRange(0), help="New retry budget.")
@json_option
def retry(task_id: str, max_retries: int | None, as_json: bool) -> None:
    """Run a failed, cancelled or expired task again (same id, history kept)."""

    async def go(a: Admin) -> dict[str, Any]:
        return await a.retry(await a.resolve_id(task_id), max_retries=max_retries)

    d = run_admin(go)
    emit(d, as_json, lambda: echo(f"{d.get('id', task_id)}: queued"))


# --- workers, schedules ----------------------------------------------------------------------


@cli.command(epilog=EPILOG)
@json_option
def workers(as_json: bool) -> None:
    """List workers with heartbeat age (stale past 3 heartbeat intervals) and the task names
    each can run. Exits 1 when no worker is live."""
    infos = run_admin(lambda a: a.list_workers())

    def human() -> None:
        rows = [
            (w.worker_id, "live" if w.live else "STALE", w.status, age(w.heartbeat_age_s),
             f"{w.active_tasks}/{w.concurrency or '?'}", ",".join(w.queues), w.hostname,
             w.pid or "", w.tasks_processed, w.tasks_failed, clip(",".join(w.tasks), 50))
            for w in infos
        ]  # fmt: skip
        heads = ["worker", "liveness", "status", "heartbeat", "in-flight", "queues", "host"]
        table(rows, [*heads, "pid", "done", "failed", "tasks"])

    emit([w.to_dict() for w in infos], as_json, human)
    if not any(w.live for w in infos):
        raise Failed("no live worker")


@cli.group(epilog=EPILOG, invoke_without_command=True)
@click.option("--queue", "-q", help="Only this queue's delayed tasks.")
@json_option
@click.pass_context
def schedules(ctx: click.Context, queue: str | None, as_json: bool) -> None:
    """List periodic schedules with their next fire times, and delayed tasks and retries
    (`dtq schedules remove NAME` removes one)."""
    if ctx.invoked_subcommand is not None:
        return

    async def go(a: Admin) -> tuple[list[dict[str, Any]], list[Any]]:
        return await a.list_schedules(queue), await a.list_scheduled(queue)

    periodic, delayed = run_admin(go)

    def human() -> None:
        echo("periodic schedules:")

        def row(s: dict[str, Any]) -> tuple[Any, ...]:
            when = s.get("cron") or (f"every {s['every']}s" if s.get("every") else "")
            fire = zoned_time(s.get("next_fire_at"), s.get("tz"))
            return s["name"], s["queue"], s["task"], when, s.get("tz") or "", fire

        table([row(s) for s in periodic], ["schedule", "queue", "task", "when", "tz", "next fire"])
        echo("delayed tasks and retries:")
        table(
            [(d.task_id, d.name, d.kind, short_time(d.due_at)) for d in delayed],
            ["task", "name", "kind", "due"],
        )

    emit({"schedules": periodic, "scheduled_tasks": [d.to_dict() for d in delayed]}, as_json, human)


@schedules.command("remove", epilog=EPILOG)
@click.argument("name")
@click.option("--queue", "-q", default="default", show_default=True, help="The schedule's queue.")
@json_option
def schedules_remove(name: str, queue: str, as_json: bool) -> None:
    """Remove periodic schedule NAME (exit 1 when there is none). One still declared in the
    code of a live worker is stored again by it."""
    removed = run_admin(lambda a: a.remove_schedule(queue, name))
    if as_json or removed:
        data = {"name": name, "queue": queue, "removed": removed}
        emit(data, as_json, lambda: echo(f"schedule {name} of queue {queue} removed"))
    if not removed:
        raise Failed(f"no schedule {name!r} in queue {queue!r}")


@cli.command(epilog=EPILOG)
@click.option("--queue", "-q", help="Only this queue (its partitions summed); default: all.")
@click.option("--minutes", "-m", type=click.IntRange(1, None), default=60, show_default=True,
              help="How far back, the current minute included.")  # fmt: skip
@click.option("--step", type=click.IntRange(1, None), default=1, show_default=True,
              help="Minutes per row (60: hourly).")  # fmt: skip
@json_option
def stats(queue: str | None, minutes: int, step: int, as_json: bool) -> None:
    """Per-minute history: enqueued, succeeded, failed, retried, cancelled, run-time p50/p95/p99
    (kept DTQ_STATS_RETENTION_H hours in Redis). The table leaves out idle minutes; --json
    lists every one."""
    rows = run_admin(lambda a: a.stats(queue=queue, minutes=minutes, step=min(step, minutes)))

    def human() -> None:
        def quantiles(b: dict[str, Any]) -> list[str]:
            return ["-" if b[q] is None else f"<={b[q]:g}s" for q in ("p50", "p95", "p99")]

        counts = ("enqueued", "succeeded", "failed", "retried", "cancelled")
        busy = [b for b in rows if any(b[c] for c in counts)]
        lines = [(short_time(b["minute"]), *(b[c] for c in counts), *quantiles(b)) for b in busy]
        table(lines, ["minute", *counts, "p50", "p95", "p99"])
        if not busy:
            echo(f"no activity in the last {minutes} minutes")

    emit(rows, as_json, human)


# --- dev, bench ------------------------------------------------------------------------------

PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def dev(argv: tuple[str, ...]) -> None:
    """Run Redis, a worker, the API/dashboard and demo tasks here (see `dtq dev --help`)."""
    from dtq.cli.dev import main as dev_main

    dev_main(list(argv))


@cli.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def bench(argv: tuple[str, ...]) -> None:
    """Run the benchmarks from a dtq checkout (see `dtq bench --help`)."""
    # The suite lives in the checkout's bench/dtq_bench, not in the wheel: found next to this
    # package (an editable install) or in the current directory.
    here = Path(__file__).resolve().parents[2]
    for root in (here, Path.cwd()):
        if (root / "bench" / "dtq_bench" / "suite.py").is_file():
            sys.path[:0] = [str(root / "bench"), str(root)]  # dtq_bench, and tools/ it uses
            from dtq_bench.suite import main as bench_main  # type: ignore[import-not-found]

            sys.exit(bench_main(list(argv)))
    echo(
        "dtq bench: the benchmark is not part of the installed package; run it from a dtq "
        "checkout (make bench, or dtq bench in the checkout's directory)",
        err=True,
    )
    sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps errors to the documented exit codes."""
    try:
        rv = cli.main(args=argv, prog_name="dtq", standalone_mode=False)
    except click.exceptions.Abort:
        echo("aborted", err=True)
        sys.exit(EXIT_FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (ConfigError, InvalidRequest) as exc:
        echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except (RedisUnavailable, redis.ConnectionError, redis.TimeoutError) as exc:
        echo(f"error: {exc}", err=True)
        sys.exit(EXIT_REDIS)
    except (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError) as exc:
        echo(f"error: Redis refused the write: {exc}", err=True)  # (as the SDK says it)
        sys.exit(EXIT_REDIS)
    except redis.ResponseError as exc:
        echo(f"error: Redis answered with an error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    except (Failed, DtqError) as exc:  # (DtqError: UnknownTask, UnknownQueue, Conflict, ...)
        echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)
