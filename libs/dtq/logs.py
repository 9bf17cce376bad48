"""Logging setup shared by the worker and the API: text for a terminal, JSON for shippers."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

from pythonjsonlogger.msgspec import MsgspecFormatter

# Control characters in a message (a task name, an error text) would let it forge log lines or
# drive a terminal: the text format shows them escaped (JSON escapes them itself).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")


def one_line(text: str) -> str:
    """``text`` with every control character shown as an escape, so it stays one line."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


class JsonFormatter(MsgspecFormatter):
    """One JSON object per line (``ts``, ``level``, ``logger``, ``msg``, ``exc`` when there is a
    traceback); extra fields (task_id, queue, attempt, ...) become keys; what JSON cannot hold
    is written as its ``str``.

    python-json-logger's msgspec formatter, replacing a hand-written one: it writes the same
    keys and is no slower (docs/performance.md, "Hand-written code").
    """

    def __init__(self) -> None:
        super().__init__(
            "{created}{levelname}{name}{message}",
            style="{",
            rename_fields={"created": "ts", "levelname": "level", "name": "logger",
                           "message": "msg", "exc_info": "exc"},
        )  # fmt: skip

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        log_data["ts"] = round(log_data["ts"], 3)
        log_data["level"] = log_data["level"].lower()
        return log_data


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.converter = time.gmtime

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The line itself; a traceback appended after it keeps its own lines.
        return one_line(super().formatMessage(record))


def setup(fmt: str = "text", level: str = "INFO") -> None:
    """Configure the ``dtq`` logger tree (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("dtq")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
