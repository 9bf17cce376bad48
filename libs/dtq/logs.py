"""Logging setup shared by the worker and the API: text for a terminal, JSON for shippers."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; extra fields (task_id, queue, attempt, ...) become keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.converter = time.gmtime


def setup(fmt: str = "text", level: str = "INFO") -> None:
    """Configure the ``dtq`` logger tree (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("dtq")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
