"""The JSON log lines (``DTQ_LOG_FORMAT=json``); imported by :func:`dtq.logs.setup` only when
they are asked for, so a process that logs text never loads python-json-logger."""

from __future__ import annotations

from typing import Any

from pythonjsonlogger.msgspec import MsgspecFormatter


class JsonFormatter(MsgspecFormatter):
    """One JSON object per line (``ts``, ``level``, ``logger``, ``msg``, ``exc`` when there is a
    traceback); extra fields (task_id, queue, attempt, ...) become keys."""

    def __init__(self) -> None:
        fields = dict(created="ts", levelname="level", name="logger", message="msg", exc_info="exc")
        super().__init__("{created}{levelname}{name}{message}", style="{", rename_fields=fields)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        log_data["ts"] = round(log_data["ts"], 3)
        log_data["level"] = log_data["level"].lower()
        return log_data
