"""The ``dtq`` queue commands: ``queues``, ``pause``, ``resume`` (a queue, or one fair group of
it with ``--group``), ``purge``, and ``groups`` (a queue's fair groups, docs/groups.md)."""

from __future__ import annotations

from typing import Any

import click

from dtq.admin import Admin
from dtq.cli.common import (
    EPILOG,
    age,
    confirm,
    cursor_option,
    echo,
    emit,
    json_option,
    run_admin,
    show_page,
    table,
    with_bar,
)
from dtq.sdk.groupops import GROUP_PAGE, MAX_GROUP_PAGE


@click.command(epilog=EPILOG)
@click.argument("name", required=False)
@json_option
def queues(name: str | None, as_json: bool) -> None:
    """List queues: waiting per priority, scheduled, running, dead letters, paused."""
    if name is None:
        infos = run_admin(lambda a: a.list_queues())
    else:
        infos = [run_admin(lambda a: a.get_queue(name))]

    def human() -> None:
        rows = []
        for q in infos:
            bands = " ".join(f"p{p}:{n}" for p, n in q.depth.items() if n) or "-"
            paused, oldest = "yes" if q.paused else "no", age(q.oldest_waiting_age_s)
            rows.append((q.name, q.queued, bands, q.scheduled, q.running, q.dlq, paused, oldest))
        table(
            rows,
            ["queue", "queued", "by priority", "scheduled", "running", "dlq", "paused", "oldest"],
        )

    data: Any = [q.to_dict() for q in infos]
    emit(data if name is None else data[0], as_json, human)


def _hold_command(pause: bool, doc: str) -> click.Command:
    """``pause`` or ``resume``: of QUEUE, or of one of its groups."""

    @click.command("pause" if pause else "resume", epilog=EPILOG, help=doc)
    @click.argument("queue")
    @click.option("--group", "-g", help="Only this fair group of the queue (docs/groups.md).")
    @json_option
    def hold(queue: str, group: str | None, as_json: bool) -> None:
        if group is None:
            changed = run_admin(lambda a: a.pause(queue) if pause else a.resume(queue))
        else:
            changed = run_admin(
                lambda a: a.pause_group(queue, group) if pause else a.resume_group(queue, group)
            )
        data: dict[str, Any] = {"queue": queue, **({} if group is None else {"group": group})}
        data.update(paused=pause, changed=changed)
        note = "" if group is None else f" group {group!r}"
        was = "" if changed else " (already)" if pause else " (was not paused)"
        done = "paused" if pause else "resumed"
        emit(data, as_json, lambda: echo(f"{queue}:{note} {done}{was}"))

    return hold


pause = _hold_command(
    True,
    "Pause QUEUE cluster-wide: workers stop taking from it; running tasks finish. With "
    "--group, only that group of QUEUE is held; its other groups go on.",
)
resume = _hold_command(False, "Resume QUEUE, or with --group one group of it.")


@click.command(epilog=EPILOG)
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def purge(queue: str, yes: bool, as_json: bool) -> None:
    """Delete every waiting (queued and scheduled) task of QUEUE. Running tasks finish."""
    info = run_admin(lambda a: a.get_queue(queue))
    confirm(f"Delete {info.queued} queued and {info.scheduled} scheduled tasks of {queue!r}?", yes)

    async def total(a: Admin) -> int:
        q = await a.get_queue(queue)
        return q.queued + q.scheduled

    res = with_bar("purging", total, lambda a, p: a.purge(queue, progress=p), as_json)
    sk = res.skipped
    done = f"{queue}: purged {res.done} tasks ({sk['queued']} queued, {sk['scheduled']} scheduled)"
    emit({"queue": queue, **res.to_dict()}, as_json, lambda: echo(done))


@click.command(epilog=EPILOG)
@click.argument("queue")
@click.option("--limit", type=click.IntRange(1, MAX_GROUP_PAGE), default=GROUP_PAGE,
              show_default=True, help="Groups per page.")  # fmt: skip
@cursor_option
@json_option
def groups(queue: str, limit: int, cursor: str | None, as_json: bool) -> None:
    """List QUEUE's fair groups: the active ones (waiting or running tasks), longest active
    first, then the paused idle ones; each with its waiting and running tasks, whether paused,
    and the age of its oldest waiting task. Tasks without a group show as (ungrouped)."""
    show_page(
        lambda a, cur, n: a.list_groups(queue, cursor=cur, limit=n),
        cursor,
        limit,
        as_json,
        ["group", "waiting", "running", "paused", "oldest"],
        lambda g: (g["group"] or "(ungrouped)", g["waiting"], g["running"],
                   "yes" if g["paused"] else "no", age(g["oldest_waiting_s"])),
    )  # fmt: skip
