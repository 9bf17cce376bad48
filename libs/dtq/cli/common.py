"""What the ``dtq`` command line's commands share: exit codes, output (tables, ``--json``),
running one admin operation, progress bars."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from dtq.admin import Admin, Page, filled_page
from dtq.logs import one_line
from dtq.settings import load_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REDIS = 0, 1, 2, 3
T = TypeVar("T")
EPILOG = (
    "Exit codes: 0 ok, 1 operation failed or not found, 2 usage/config error, 3 Redis unreachable."
)


class Failed(Exception):
    """The operation did not happen; message printed, exit code 1."""


def run_admin(fn: Callable[[Admin], Awaitable[T]]) -> T:
    """Run one admin operation with a fresh connection."""
    # The root's flags; given but empty is refused by the settings (one line, exit 2).
    flags = click.get_current_context().find_root().obj or {}
    settings = load_settings(**{k: v for k, v in flags.items() if v is not None})

    async def go() -> T:
        async with Admin(settings) as admin:
            await admin.ping()
            return await fn(admin)

    return asyncio.run(go())


def echo(text: Any = "", err: bool = False) -> None:
    """One line of human output: control characters in a name or an error text are shown
    escaped, so a stored name cannot forge table rows or drive the terminal."""
    click.echo(one_line(str(text)), err=err)


def emit(data: Any, as_json: bool, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))  # (JSON escapes controls)
    else:
        human()


def confirm(question: str, yes: bool) -> None:
    """Ask ``question`` on stderr unless ``yes`` (--yes); "no" aborts (exit 1)."""
    if not yes:
        click.confirm(question, abort=True, err=True)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    # Hand-written: tabulate would be slower (docs/performance.md, "Hand-written code") and a
    # dependency of every SDK install for these six lines.
    if not rows:
        echo("(none)")
        return
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    echo("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)))
    for r in cells:
        echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def short_time(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError):
        return str(iso)  # shown as stored


def zoned_time(iso: str | None, tz: str | None) -> str:
    """A time in zone ``tz`` with the zone's abbreviation, and in UTC beside it."""
    if not iso or not tz or tz == "UTC":
        return short_time(iso) + (" UTC" if iso else "")
    when = datetime.fromisoformat(iso)
    try:
        local = when.astimezone(ZoneInfo(tz))
    except (ZoneInfoNotFoundError, ValueError):
        return short_time(iso) + " UTC"
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({when.astimezone(UTC):%H:%M:%S} UTC)"


def clip(text: str | None, n: int = 60) -> str:
    if not text:
        return ""
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _json_here_or_before(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """A command's ``--json``, or the one given before the command (``dtq --json queues``)."""
    return value or bool(ctx.find_root().params.get("as_json"))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts.", callback=_json_here_or_before
)


def with_bar(
    label: str,
    total_fn: Callable[[Admin], Awaitable[int]],
    op: Callable[[Admin, Callable[[int], None]], Awaitable[T]],
    quiet: bool = False,
) -> T:
    """Run a bulk operation with a progress bar on stderr (none when ``quiet``: --json)."""

    async def go(a: Admin) -> T:
        if quiet:
            return await op(a, lambda _n: None)
        total = await total_fn(a)
        with click.progressbar(length=max(total, 1), label=label, file=sys.stderr) as bar:
            return await op(a, bar.update)

    return run_admin(go)


cursor_option = click.option("--cursor", help="Continue from the cursor a previous page printed.")


def show_page(
    fetch: Callable[[Admin, str | None, int], Awaitable[Page]],
    cursor: str | None,
    limit: int,
    as_json: bool,
    headers: Sequence[str],
    row: Callable[[Any], Sequence[Any]],
) -> None:
    """A listing from ``cursor`` filled to ``limit`` items: a table (one ``row`` per item) and
    the next cursor, or JSON."""
    page = run_admin(lambda a: filled_page(lambda cur, n: fetch(a, cur, n), cursor, limit))

    def human() -> None:
        table([row(x) for x in page.items], headers)
        if page.next_cursor:
            echo(f"more: --cursor {page.next_cursor}")

    emit({"items": page.items, "next_cursor": page.next_cursor}, as_json, human)
