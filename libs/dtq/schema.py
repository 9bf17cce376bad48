"""The keyspace's schema version (``P:schema``): which task records its clients may write.

* ``"1"``: every record holds every field, those at their defaults too (``attempt``,
  ``retries`` and ``intr`` 0, ``maxr`` 3, ``prio`` 5): workers of dtq before schema 2 read
  them, and fail on a record without them.
* ``"2"``: a record leaves out the fields at their defaults (lua/_common.lua, ``DEF_MAXR``);
  every script of this version reads an absent one as its default. A smaller record costs
  every step of a task less Redis time (docs/performance.md, "A record without its defaults").
* ``"1>2"``: the move from 1 to 2 is under way (:mod:`dtq_worker.schema_move`). Clients still
  write full records; a worker of an older version refuses to start, as it refuses any version
  but its own.

A fresh keyspace gets ``"2"`` from the first process of this version that touches it, client or
worker (``SET NX``). A keyspace at ``"1"`` is moved by this version's workers once no worker of
an older version is alive. A client reads the version with each registration of a queue
(``dtq.partitions.register``: its first enqueue there, then every ``REGISTER_EVERY_S``), so a
client started before the move writes full records until then: they stay valid at schema 2.
"""

from __future__ import annotations

from typing import Any

from dtq.keys import SCHEMA_VERSION, Keys

LEGACY = "1"
MOVING = "1>2"
CURRENT = SCHEMA_VERSION
KNOWN = (LEGACY, MOVING, CURRENT)
# The heartbeat-hash field (P:worker:<id>) of a worker that reads records at schema CURRENT: a
# worker without it is of an older version, and the keyspace stays at LEGACY while one lives.
WORKER_FIELD = "schema"


def read_calls(pipe: Any, keys: Keys) -> None:
    """Queue on ``pipe`` the two commands whose last reply is the keyspace's version: a fresh
    keyspace is made CURRENT (``SET NX``: one at an older version keeps its own)."""
    pipe.set(keys.schema, CURRENT, nx=True)
    pipe.get(keys.schema)


def compact(found: object) -> bool:
    """Whether a client may write records without their defaults, given the version found."""
    if isinstance(found, bytes):
        found = found.decode()
    return bool(found == CURRENT)
