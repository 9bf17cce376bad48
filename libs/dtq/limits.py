"""Fleet-wide limits declared on a task: concurrency per key and rate (starts per window),
enforced by the claim for every worker at once (docs/limits.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dtq.errors import InvalidRequest

MAX_KEY_LEN = 200
# Hand-written: the `limits` package's parse() reads none of the forms documented here ("10/s",
# "3/10s", "20/500ms") and is slower (docs/performance.md, "Hand-written code").
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` starts in any window of ``window_ms`` milliseconds (sliding)."""

    count: int
    window_ms: int

    def __post_init__(self) -> None:
        if self.count < 1 or self.window_ms < 1:
            raise InvalidRequest("a rate needs a count and a window of at least 1")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"10/s"``, ``"100/m"``, ``"5/h"``, ``"1/d"``, ``"3/10s"``, ``"20/500ms"``."""
        m = _RATE_RE.match(text)
        if not m:
            raise InvalidRequest(f"bad rate {text!r}: use N/unit, e.g. '10/s', '3/10s', '100/m'")
        count, amount, unit = int(m.group(1)), m.group(2), m.group(3)
        window = (float(amount) if amount else 1.0) * _UNIT_MS[unit]
        return cls(count, math.ceil(window))

    def __str__(self) -> str:
        return f"{self.count}/{self.window_ms}ms"


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit shared by every worker, declared with ``@app.task(limit=Limit(...))``.

    ``key`` is called with the task's positional and keyword arguments and returns the limit key
    (e.g. the tenant; without it the task name is the key; keys are per queue); ``concurrency``
    caps runs of one key at a time; ``rate`` caps starts of one key per window (``"10/s"`` or a
    :class:`Rate`). At least one of the two caps is needed.
    """

    key: Callable[..., Any] | None = None
    concurrency: int | None = None
    rate: Rate | str | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise InvalidRequest("a Limit needs concurrency=, rate= or both")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise InvalidRequest("Limit concurrency must be a positive integer")
        if isinstance(self.rate, str):
            object.__setattr__(self, "rate", Rate.parse(self.rate))
        elif self.rate is not None and not isinstance(self.rate, Rate):
            raise InvalidRequest("Limit rate must be a string like '10/s' or a dtq.Rate")

    def key_for(self, task_name: str, args: Any, kwargs: Mapping[str, Any] | None) -> str:
        """The limit key of one call (the task name when no key function is given)."""
        if self.key is None:
            return task_name
        pos = list(args) if isinstance(args, list | tuple) else ([] if args is None else [args])
        try:
            value = self.key(*pos, **dict(kwargs or {}))
        except Exception as exc:
            raise InvalidRequest(
                f"limit key of {task_name!r} could not be computed: {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidRequest(f"limit key of {task_name!r} must be a str or int")
        text = str(value)
        if not 0 < len(text) <= MAX_KEY_LEN:
            raise InvalidRequest(f"limit key must be 1 to {MAX_KEY_LEN} characters")
        return text

    def encode(self, task_name: str, args: Any, kwargs: Mapping[str, Any] | None) -> str:
        """The record's limit spec as enqueue.lua takes it: ``conc|count|window_ms|key``."""
        rate = self.rate if isinstance(self.rate, Rate) else None  # (a str was parsed already)
        count, window = (rate.count, rate.window_ms) if rate else (0, 0)
        return f"{self.concurrency or 0}|{count}|{window}|{self.key_for(task_name, args, kwargs)}"
