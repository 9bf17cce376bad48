"""Which task names a live worker runs, as ``dtq workers`` shows them.

Each worker publishes its task names (a JSON list) in the ``tasks`` field of its heartbeat
hash, which expires with the worker. (Whether a live worker of a queue declares a name, for the
clients' UndeclaredTaskWarning and ``dtq enqueue``, is read from the queue's ``decl:seen``
stamps instead: dtq.sdk.clientbase.)
"""

from __future__ import annotations

import json

TASKS_FIELD = "tasks"


def task_names(raw: str | None) -> list[str]:
    """A worker's published task names (its heartbeat's ``tasks`` field); [] when absent or
    not a JSON list of names."""
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        return []
    return sorted(n for n in names if isinstance(n, str)) if isinstance(names, list) else []
