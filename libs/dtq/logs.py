"""Logging setup shared by the worker and the API: text for a terminal, JSON for shippers."""

from __future__ import annotations

import logging
import re
import sys
import time

from dtq.context import running_task

# C0 and C1 controls, DEL, the Unicode line separators: in a name or a log line they could
# forge lines or drive a terminal. No name may hold one; the text format escapes them.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")


def one_line(text: str) -> str:
    """``text`` with every control character shown as an escape, so it stays one line."""
    return CONTROL_RE.sub(_escape, text) if CONTROL_RE.search(text) else text


class TaskContextFilter(logging.Filter):
    """A handler filter: a record logged inside a running task (without its own ``task_id``)
    gets the task's ``task_id``, ``task`` and ``attempt`` (docs/operations.md, "Logs")."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "task_id" not in record.__dict__:
            ctx = running_task()
            if ctx is not None:
                record.task_id, record.task, record.attempt = ctx.id, ctx.name, ctx.attempt
                record._dtq_task = True
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.converter = time.gmtime

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The line itself; a traceback appended after it keeps its own lines.
        line = super().formatMessage(record)
        if "_dtq_task" in record.__dict__:  # a task's own record: say which run wrote it
            head, sep, msg = line.partition(f"{record.name}: ")
            d = record.__dict__
            tag = f"{record.name} [{d['task']} {d['task_id']} attempt {d['attempt']}]: "
            line = head + tag + msg if sep else line
        return one_line(line)


def setup(fmt: str = "text", level: str = "INFO", *, tasks: bool = False) -> None:
    """Configure the ``dtq`` logger tree (idempotent).

    ``tasks`` (the worker): the root logger gets the same handler and level too, unless it has
    handlers already, so the records a task logs through its own loggers reach the worker's log
    at its level, tagged with the run (:class:`TaskContextFilter`).
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from dtq.jsonlog import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    handler.addFilter(TaskContextFilter())
    dtq_log = logging.getLogger("dtq")
    dtq_log.handlers[:] = [handler]
    dtq_log.setLevel(level)
    dtq_log.propagate = False
    if tasks:
        root = logging.getLogger()
        if not root.handlers:
            root.addHandler(handler)
        root.setLevel(level)
