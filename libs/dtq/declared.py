"""Defaults a worker declares (``@app.task(max_retries=, timeout=, expires=)``), for tasks
enqueued by clients that never imported the task (docs/design.md, "Declared defaults"), and the
task names a worker publishes for ``dtq workers``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dtq.sdk.requests import DEFAULT_MAX_RETRIES, TaskDefaults
from dtq.store.record import Field


def encode(d: TaskDefaults) -> str:
    """``"max_retries|timeout_s|expires_ms"``, empty where the task declares none."""
    timeout = "" if d.timeout is None else repr(float(d.timeout))
    expires = "" if d.expires is None else str(max(1, round(d.expires * 1000)))
    return f"{d.max_retries}|{timeout}|{expires}"


def declarations(tasks: Iterable[tuple[str, TaskDefaults]]) -> dict[str, str]:
    """The hash a worker publishes: every task it runs, whatever queue it was declared on (a
    task enqueued by name may be sent to any queue the worker consumes)."""
    return {name: encode(d) for name, d in tasks}


@dataclass(frozen=True, slots=True)
class Declared:
    max_retries: int
    timeout: float | None
    expires_ms: int | None


def decode(raw: str | None) -> Declared | None:
    """A published declaration, or None for a missing or unreadable one."""
    if not raw:
        return None
    try:
        m, t, e = raw.split("|")
        return Declared(int(m), float(t) if t else None, int(e) if e else None)
    except ValueError:
        return None


def pending(rec: Mapping[str, str]) -> str:
    """The letters of the fields a record still leaves to a declaration ('' once claimed): m
    max_retries, t timeout, e expires."""
    return rec.get(Field.LEFT_TO_DECLARATION) or ""


def fill(rec: Mapping[str, str], raw: str | None) -> tuple[dict[str, str], str | None]:
    """What a not-yet-claimed record will run with: its fields with the unset ones filled as
    the claim will fill them, and where they came from ("declared", "default"; None when
    nothing was unset). Display only: the claim is what fixes them."""
    letters = pending(rec)
    if not letters:
        return dict(rec), None
    d = decode(raw)
    out = dict(rec)
    if "m" in letters:
        out[Field.MAX_RETRIES] = str(d.max_retries if d else DEFAULT_MAX_RETRIES)
    if d is not None and "t" in letters and Field.TIMEOUT not in rec and d.timeout is not None:
        out[Field.TIMEOUT] = repr(d.timeout)
    if d is not None and "e" in letters and Field.EXPIRES not in rec and d.expires_ms is not None:
        out[Field.EXPIRES] = str(int(rec.get(Field.ENQUEUED) or 0) + d.expires_ms)
    return out, "declared" if d else "default"


# --- the task names a worker publishes (``dtq workers``) ---

TASKS_FIELD = "tasks"


def task_names(raw: str | None) -> list[str]:
    """A worker's published task names (its heartbeat's ``tasks`` field); [] when absent or
    not a JSON list of names."""
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        return []
    return sorted(n for n in names if isinstance(n, str)) if isinstance(names, list) else []
