"""Logging setup shared by the worker and the API: text for a terminal, JSON for shippers."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtq.jsonlog import JsonFormatter as JsonFormatter

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
    if fmt == "json":
        from dtq.jsonlog import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger("dtq")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


# python-json-logger loads only when JSON lines are asked for (most runs write text).
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name == "JsonFormatter":
            from dtq.jsonlog import JsonFormatter

            return JsonFormatter
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
