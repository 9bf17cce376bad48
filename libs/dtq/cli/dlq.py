"""``dtq dlq``: the dead-letter commands (list, requeue, discard, purge)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from dtq.admin import Admin
from dtq.cli.common import (
    EPILOG,
    Failed,
    clip,
    confirm,
    cursor_option,
    echo,
    emit,
    json_option,
    short_time,
    show_page,
    with_bar,
)


@click.group(epilog=EPILOG, invoke_without_command=True)
@click.pass_context
def dlq(ctx: click.Context) -> None:
    """Dead-letter queue: failed tasks. list (the default), requeue, discard, purge."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(dlq_list)


def _filters(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--error", "-e", help="Only those whose last error contains this text.")(f)
    f = click.option("--name", "-n", help="Only tasks of this name.")(f)
    f = click.option("--queue", "-q", help="Only this queue.")(f)
    return f


@dlq.command("list", epilog=EPILOG)
@_filters
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@cursor_option
@json_option
def dlq_list(
    queue: str | None,
    name: str | None,
    error: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List dead letters, newest failure first, with their last error."""
    show_page(
        lambda a, cur, n: a.dlq_list(queue=queue, name=name, error=error, cursor=cur, limit=n),
        cursor,
        limit,
        as_json,
        ["task", "name", "failed", "attempts", "error"],
        lambda d: (d["task_id"], d["name"], short_time(d["failed_at"]), d["attempt"],
                   clip(d["error"])),
    )  # fmt: skip


def _bulk_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """IDS, or filters or --all; --yes, --json: the options of requeue and discard."""
    f = json_option(f)
    f = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(f)
    f = _filters(f)
    f = click.option(
        "--all", "all_", is_flag=True, help="Every dead letter (of --queue if given)."
    )(f)
    return click.argument("ids", nargs=-1)(f)


def _bulk(
    verb: str,
    done: str,
    op: Callable[..., Awaitable[Any]],
    ids: tuple[str, ...],
    all_: bool,
    queue: str | None,
    name: str | None,
    error: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """``op(admin, ids or None, queue=, name=, error=, progress=)`` over IDS or the filters,
    with a progress bar; its result reported as ``done``."""
    filters = {"queue": queue, "name": name, "error": error}
    chosen = all_ or any(filters.values())
    if ids and chosen:
        raise click.UsageError("give task ids, or filters/--all, not both")
    if not ids and not chosen:
        raise click.UsageError("give task ids, a filter (--queue/--name/--error) or --all")
    if not ids:
        what = " ".join(f"{k}={v}" for k, v in filters.items() if v)
        confirm(f"{verb} every dead letter{' matching ' + what if what else ''}?", yes)

    async def total(a: Admin) -> int:
        return len(ids) if ids else await a.dlq_count(queue)

    tids = list(ids) if ids else None
    res = with_bar(verb, total, lambda a, p: op(a, tids, progress=p, **filters), as_json)

    def human() -> None:
        skipped = ", ".join(f"{n} {why}" for why, n in res.skipped.items())
        echo(f"{done} {res.done}" + (f"; skipped: {skipped}" if skipped else ""))

    emit(res.to_dict(), as_json, human)
    if res.done == 0 and res.skipped:
        raise Failed(f"nothing {done}")


@dlq.command("requeue", epilog=EPILOG)
@_bulk_options
@click.option("--max-retries", type=click.IntRange(0), help="Give the tasks a new retry budget.")
def dlq_requeue(max_retries: int | None, **bulk: Any) -> None:
    """Requeue dead letters: IDS, or all matching the filters. Ids and history are kept."""
    op = lambda a, tids, **kw: a.dlq_requeue(tids, max_retries=max_retries, **kw)  # noqa: E731
    _bulk("requeue", "requeued", op, **bulk)


@dlq.command("discard", epilog=EPILOG)
@_bulk_options
def dlq_discard(**bulk: Any) -> None:
    """Delete dead letters for good: IDS, or all matching the filters."""
    _bulk("discard", "discarded", lambda a, tids, **kw: a.dlq_discard(tids, **kw), **bulk)


@dlq.command("purge", epilog=EPILOG)
@click.option("--queue", "-q", help="Only this queue (default: every queue).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def dlq_purge(queue: str | None, yes: bool, as_json: bool) -> None:
    """Delete every dead letter (of one queue, or all)."""
    confirm(f"Delete every dead letter{' of ' + queue if queue else ''}?", yes)
    n = with_bar(
        "purging",
        lambda a: a.dlq_count(queue),
        lambda a, p: a.dlq_purge(queue, progress=p),
        as_json,
    )
    emit({"discarded": n}, as_json, lambda: echo(f"discarded {n} dead letters"))
