"""The fair groups' operator surface in the SDK (docs/groups.md): list a queue's groups, hold
(pause) and release (resume) one; step generators driven by the clients (dtq.sdk.client).

A listing walks each partition's active groups, then its held ones; a page's work is bounded
(at most ``limit`` names and :data:`GROUP_BUDGET` (name, partition) lookups), so a queue of many
partitions gets fewer names a page (docs/operations.md, "The groups listing").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dtq import codec
from dtq.errors import InvalidRequest
from dtq.models import GroupInfo, GroupPage
from dtq.scripts.groups import Held, group_hold_call, parse_group_hold
from dtq.settings import Settings
from dtq.store.connection import is_cluster
from dtq.store.keys import GROUP_MARK, PRIORITIES, QUEUE_NAME_RE, Keys
from dtq.store.partitions import expand
from dtq.store.record import Field

if TYPE_CHECKING:
    from dtq.sdk.client import Steps

MAX_GROUP_LEN = 256
"""The longest group name (characters)."""
GROUP_PAGE = 100
"""Groups per page unless asked otherwise."""
MAX_GROUP_PAGE = 1000
GROUP_BUDGET = 10_000
"""Most (group, partition) lookups one page makes: 23 commands each, pipelined."""
_MAX_READS = 64  # most round trips one page spends finding names (a sparse held set's SSCAN)
# replies per (group, partition): LLEN and LRANGE 0 1 x bands, ZCARD, SISMEMBER, ZSCORE
_PER = 2 * len(PRIORITIES) + 3

Step = Callable[[Any], Any]


def check_group(group: object) -> str:
    """``group`` when it names a group that can be held: a string of 1 to 256 characters."""
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_LEN:
        raise InvalidRequest(f"group must be a string of 1 to {MAX_GROUP_LEN} characters")
    if not group.isascii():
        codec.utf8(group, "group")
    return group


def _physical(settings: Settings, queue: object) -> list[str]:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        raise InvalidRequest(f"bad queue name {queue!r}: use letters, digits, '_', '.', '-'")
    return expand([queue], settings.queue_partitions)


# --- hold and release ---------------------------------------------------------------------


def hold_steps(keys: Keys, settings: Settings, queue: str, group: str, hold: bool) -> Steps[bool]:
    """Hold (``hold``) or release ``group`` in every partition of ``queue``; True when any
    partition's state changed."""
    check_group(group)
    changed = False
    for q in _physical(settings, queue):
        call = group_hold_call(keys.queue(q), group, hold, settings.events_maxlen)
        changed = parse_group_hold((yield call)) is Held.CHANGED or changed
    return changed


# --- the listing --------------------------------------------------------------------------


CURSOR_RE = r"^[ip][0-9]{1,3}\.[0-9]{1,19}(\.[0-9]{1,9})?$"
"""A listing cursor (the API's pattern): any cursor it matches is taken (no 422 for one)."""
_CURSOR = re.compile(r"([ip])([0-9]{1,3})\.([0-9]{1,19})(?:\.([0-9]{1,9}))?\Z")
_FAR = 2**40  # a rank past any group index (ZRANGE takes a signed 64-bit start)


def _cursor(cursor: str | None) -> tuple[str, int, int, int]:
    """(phase, partition, position, skip) of a listing cursor ``<i|p><partition>.<position>
    [.<skip>]``: phase ``i`` walks a partition's active groups (position: the rank in
    ``group_index``), ``p`` its held set (position: an SSCAN cursor; skip: the names of that
    SSCAN batch already listed). A partition past the queue's last ends the listing."""
    if not cursor:
        return "i", 0, 0, 0
    m = _CURSOR.match(cursor) if isinstance(cursor, str) else None
    if m is None:
        raise InvalidRequest(f"bad cursor {cursor!r}")
    if m[1] == "i":
        return "i", int(m[2]), min(int(m[3]), _FAR), 0
    return "p", int(m[2]), int(m[3]), int(m[4] or 0)


def _zrange(key: str, start: int, stop: int) -> Step:
    return lambda r: r.zrange(key, start, stop)


def _sscan(key: str, pos: int, count: int) -> Step:
    return lambda r: r.sscan(key, pos, count=count)


def _names_steps(
    keys: Keys, parts: Sequence[str], cursor: str | None, want: int
) -> Steps[tuple[list[tuple[str, str, int]], str | None]]:
    """Up to ``want`` names from the cursor on, each with where it was found (phase,
    partition); and the cursor after them (None at the end)."""
    phase, at, pos, skip = _cursor(cursor)
    found: list[tuple[str, str, int]] = []
    reads = 0
    while at < len(parts) and len(found) < want and reads < _MAX_READS:
        qk, room, reads = keys.queue(parts[at]), want - len(found), reads + 1
        if phase == "i":
            got = [str(x) for x in (yield _zrange(qk.group_index, pos, pos + room - 1))]
            found += [(n, "i", at) for n in got]
            phase, pos = ("p", 0) if len(got) < room else ("i", pos + len(got))
            continue
        nxt, batch = yield _sscan(qk.group_paused, pos, room)
        rest = [str(x) for x in batch][skip:]
        found += [(n, "p", at) for n in rest[:room]]
        if len(rest) > room:  # the rest of this batch on the next page
            skip += room
        elif int(nxt) == 0:
            phase, at, pos, skip = "i", at + 1, 0, 0
        else:
            pos, skip = int(nxt), 0
    if at >= len(parts):
        return found, None
    return found, f"{phase}{at}.{pos}" + (f".{skip}" if skip else "")


WITHHELD = "~"  # a list's head while the group's turn is held back (docs/groups.md)


def _state(keys: Keys, parts: Sequence[str], names: Sequence[str]) -> Step:
    """One pipeline: each name's keys in each partition (``_PER`` replies), then TIME (left
    out on a cluster, whose pipelines refuse it)."""

    def read(r: Any) -> Any:
        pipe = r.pipeline(transaction=False)
        for name in names:
            for q in parts:
                qk = keys.queue(q)
                for band in PRIORITIES:
                    pipe.llen(qk.group_waiting(band, name))
                for band in PRIORITIES:
                    pipe.lrange(qk.group_waiting(band, name), 0, 1)
                pipe.get(qk.group_running(name))
                pipe.sismember(qk.group_paused, name)
                pipe.zscore(qk.group_index, name)
        if not is_cluster(r):
            pipe.time()
        return pipe.execute()

    return read


def _enq_times(keys: Keys, turns: Sequence[tuple[str, str]]) -> Step:
    """The enqueue times of the turn tasks ``(physical queue, tid)``."""

    def read(r: Any) -> Any:
        pipe = r.pipeline(transaction=False)
        for q, tid in turns:
            pipe.hget(keys.queue(q).task(tid), Field.ENQUEUED)
        return pipe.execute()

    return read


class _Seen:
    """One name's numbers, partitions summed, and where it is active or held."""

    def __init__(self) -> None:
        self.waiting = self.running = 0
        self.active: list[int] = []  # partitions where it is active
        self.held: list[int] = []  # partitions where it is held
        self.turns: list[tuple[str, str]] = []  # (physical queue, tid) of its turns

    def listed_at(self, phase: str, at: int) -> bool:
        """Whether the name found at (phase, partition) is listed there: an active group at
        the first partition where it is active, an idle held one at the first that holds it
        (so each is listed once, whichever partitions hold it)."""
        if phase == "i":
            return bool(self.active) and self.active[0] == at
        return not self.active and bool(self.held) and self.held[0] == at


def _seen(parts: Sequence[str], names: Sequence[str], raw: Sequence[Any]) -> dict[str, _Seen]:
    out: dict[str, _Seen] = {}
    k = 0
    for name in names:
        s = out[name] = _Seen()
        for j, q in enumerate(parts):
            one = raw[k : k + _PER]
            k += _PER
            nb = len(PRIORITIES)
            for n, head in zip(one[:nb], one[nb : 2 * nb], strict=True):
                head = [str(t) for t in head]
                if head and head[0] == WITHHELD:  # a turn held back (pause, cap): the next task
                    s.waiting += int(n) - 1
                    head = head[1:]
                else:
                    s.waiting += int(n)
                if head:  # the turn's task: the band's oldest waiting
                    s.turns.append((q, head[0]))
            s.running += int(one[-3] or 0) % GROUP_MARK
            if int(one[-2]):
                s.held.append(j)
            if one[-1] is not None:
                s.active.append(j)
    return out


def list_steps(
    keys: Keys, settings: Settings, queue: str, cursor: str | None, limit: int
) -> Steps[GroupPage]:
    """A page of ``queue``'s groups from ``cursor`` (see the module's docstring)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_GROUP_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_GROUP_PAGE}")
    parts = _physical(settings, queue)
    want = min(limit, max(1, GROUP_BUDGET // len(parts)))
    found, nxt = yield from _names_steps(keys, parts, cursor, want)
    names = list(dict.fromkeys(n for n, _, _ in found))
    if not names:
        return GroupPage([], nxt)
    raw = yield _state(keys, parts, names)
    if len(raw) == len(names) * len(parts) * _PER:  # a cluster: TIME on its own
        raw = [*raw, (yield lambda r: r.time())]
    seen = _seen(parts, names, raw)
    listed = list(dict.fromkeys(n for n, phase, at in found if seen[n].listed_at(phase, at)))
    turns = [t for n in listed for t in seen[n].turns]
    enq = (yield _enq_times(keys, turns)) if turns else []
    now_ms = int(raw[-1][0]) * 1000 + int(raw[-1][1]) // 1000
    first: dict[tuple[str, str], int] = {}
    for t, ms in zip(turns, enq, strict=True):
        if ms is not None and str(ms).isdigit():
            first[t] = int(ms)
    items = []
    for n in listed:
        s = seen[n]
        times = [first[t] for t in s.turns if t in first]
        oldest = max(0.0, (now_ms - min(times)) / 1000) if times else None
        items.append(GroupInfo(n, s.waiting, s.running, bool(s.held), oldest))
    return GroupPage(items, nxt, len(names))
