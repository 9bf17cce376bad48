"""Hand-written helpers against the PyPI libraries that could replace them (issue 18), per call,
best of 7 rounds, no Redis. Needs the candidates installed in the venv:

    .venv/bin/pip install tabulate python-json-logger sse-starlette limits python-ulid
    .venv/bin/python tools/bench_handwritten.py

The numbers quoted in the comments of dtq/logs.py, dtq/limits.py, dtq/store/keys.py, dtq/cli.py and
dtq_api/events.py come from this script.
"""

from __future__ import annotations

import io
import json
import logging
import timeit
from collections.abc import Callable


def best_us(fn: Callable[[], object], n: int = 20_000) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6


def show(name: str, fn: Callable[[], object], n: int = 20_000) -> None:
    try:
        print(f"{name:48s} {best_us(fn, n):8.2f} us")
    except Exception as exc:  # a candidate that cannot do the job says so
        print(f"{name:48s} cannot: {exc}")


def logs() -> None:
    from pythonjsonlogger.json import JsonFormatter as PJL

    from dtq.jsonlog import JsonFormatter

    rec = logging.LogRecord("dtq.worker", logging.INFO, __file__, 1, "started %s %s attempt %d",
                            ("send_email", "default:0123", 1), None)  # fmt: skip
    rec.task_id, rec.queue, rec.attempt, rec.worker = "default:0123", "default", 1, "w1"
    ours = JsonFormatter()
    pjl = PJL("{created}{levelname}{name}{message}", style="{",
              rename_fields={"created": "ts", "levelname": "level", "name": "logger",
                             "message": "msg"})  # fmt: skip
    show("log line: dtq.jsonlog.JsonFormatter", lambda: ours.format(rec))
    show("log line: python-json-logger JsonFormatter", lambda: pjl.format(rec))
    try:
        from pythonjsonlogger.msgspec import MsgspecFormatter

        pm = MsgspecFormatter("{created}{levelname}{name}{message}", style="{")
        show("log line: python-json-logger MsgspecFormatter", lambda: pm.format(rec))
    except ImportError:
        pass


def rates() -> None:
    import limits

    from dtq.limits import Rate

    show("rate: dtq Rate.parse('10/s')", lambda: Rate.parse("10/s"))
    show("rate: limits.parse('10/second')", lambda: limits.parse("10/second"))
    for text in ("10/s", "3/10s", "20/500ms"):
        show(f"rate: limits.parse({text!r})", lambda t=text: limits.parse(t))  # type: ignore[misc]


def tids() -> None:
    import ulid

    from dtq.store.keys import new_tid

    show("id: dtq new_tid()", new_tid, 200_000)
    show("id: python-ulid ULID().hex[:28]", lambda: ulid.ULID().hex[:28], 200_000)


def sse() -> None:
    from sse_starlette import ServerSentEvent

    data = {"id": "1733000000000-0", "type": "succeeded", "task_id": "default:0123", "attempt": 1}
    show("sse: f-string frame", lambda: f"id: {data['id']}\ndata: {json.dumps(data)}\n\n".encode())
    show(
        "sse: sse-starlette ServerSentEvent.encode",
        lambda: ServerSentEvent(data=json.dumps(data), id=data["id"], sep="\n").encode(),
    )


def tables() -> None:
    from contextlib import redirect_stdout

    from tabulate import tabulate

    from dtq import cli

    rows = [[f"default:{i:028x}", "send_email", "succeeded", i, None] for i in range(50)]
    heads = ["id", "name", "status", "attempt", "error"]

    def ours() -> None:
        with redirect_stdout(io.StringIO()):
            cli._table(rows, heads)

    show("table 50 rows: dtq cli._table (old)", ours, 500)
    show("table 50 rows: tabulate plain",
         lambda: tabulate(rows, [h.upper() for h in heads], tablefmt="plain",
                          disable_numparse=True), 500)  # fmt: skip


if __name__ == "__main__":
    for part in (logs, rates, tids, sse, tables):
        part()
