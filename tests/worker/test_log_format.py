"""The JSON log line's shape (DTQ_LOG_FORMAT=json), whatever formats it: log shippers and
dashboards key on these names."""

from __future__ import annotations

import json
import logging
import sys

from dtq.jsonlog import JsonFormatter


def test_json_log_line_keeps_its_keys_extras_and_traceback() -> None:
    rec = logging.LogRecord(
        "dtq.worker", logging.WARNING, __file__, 1, "stale %s attempt %d", ("default:01", 2), None
    )
    rec.created = 1_796_000_000.123456
    rec.task_id, rec.attempt, rec.obj, rec._hidden = "default:01", 2, object(), 1
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert out["ts"] == 1_796_000_000.123 and out["level"] == "warning"
    assert out["logger"] == "dtq.worker" and out["msg"] == "stale default:01 attempt 2"
    assert out["task_id"] == "default:01" and out["attempt"] == 2
    assert out["obj"].startswith("<object object")  # not JSON: written as its str
    assert "_hidden" not in out and "exc" not in out and "args" not in out
    try:
        raise KeyError("gone")
    except KeyError:
        rec.exc_info = sys.exc_info()
    out = json.loads(JsonFormatter().format(rec))
    assert out["exc"].startswith("Traceback") and out["exc"].endswith("KeyError: 'gone'")
