"""Every error dtq raises on purpose can be caught by importing it from ``dtq``."""

from __future__ import annotations

import dtq
import dtq.admin
import dtq.schedules
import dtq.store.keys
from dtq.errors import DtqError


def _all_subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all_subclasses(sub)}
    return out


def test_every_dtq_error_is_exported_from_dtq() -> None:
    errors = {c for c in _all_subclasses(DtqError) if c.__module__.startswith("dtq.")}
    assert {"BadTaskId", "UnknownQueue", "Conflict", "UnknownSchedule"} <= {
        c.__name__ for c in errors
    }
    missing = sorted(c.__name__ for c in errors if getattr(dtq, c.__name__, None) is not c)
    assert not missing, f"add to dtq/__init__.py and its __all__: {missing}"
    assert {c.__name__ for c in errors | {DtqError}} <= set(dtq.__all__)


def test_the_old_homes_still_import() -> None:
    assert dtq.admin.UnknownQueue is dtq.UnknownQueue
    assert dtq.admin.Conflict is dtq.Conflict
    assert dtq.schedules.UnknownSchedule is dtq.UnknownSchedule
