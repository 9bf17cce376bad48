"""Fair groups through the SDK with real worker processes (docs/groups.md): one group's backlog
does not hold another's tasks behind it, a group cap holds across several workers (one of them
killed -9) while other groups run, and a paused group holds only itself. On one server and on
the cluster fixture."""

from __future__ import annotations

import signal
import time
from collections import defaultdict

import pytest
import redis

from dtq import Client, TaskStatus
from dtq.settings import Settings
from tests.apps.limited import app
from tests.conftest import wait_until
from tests.helpers import peak_overlap, spans

APP = "tests.apps.limited:app"

pytestmark = pytest.mark.cluster


def group_keys(r: redis.Redis, settings: Settings) -> list[str]:
    from dtq.store.keys import Keys

    qk = Keys(settings.key_prefix).queue("default")
    return sorted(r.scan_iter(match=qk.group_base + "*"))


def test_a_backlog_in_one_group_does_not_hold_another_behind_it(
    settings: Settings, r: redis.Redis, spawn_worker: object
) -> None:
    app.configure(settings)
    with Client(settings=settings, app=app) as c:
        big = c.enqueue_many(
            [{"name": "free_job", "args": ["big"], "group": "big"} for _ in range(2000)]
        )
        small = [c.enqueue("free_job", ["small"], group="small") for _ in range(20)]
        assert c.get(small[0].id).group == "small"
        w = spawn_worker(APP, settings, "--concurrency", "8")  # type: ignore[operator]
        for h in [*small, *big]:
            c.result(h.id, timeout=120)
        order = [tag for tag, *_ in sorted(spans(settings, r), key=lambda s: s[1])]
        # Every task of the small group started before the 200th of the big one (in turn:
        # about one of each until the small group is done).
        assert order.index("big") < 200
        big_200th = [i for i, tag in enumerate(order) if tag == "big"][199]
        small_last = max(i for i, tag in enumerate(order) if tag == "small")
        assert small_last < big_200th, (small_last, big_200th)
        wait_until(lambda: group_keys(r, settings) == [], 20)  # idle groups leave no key
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0


@pytest.mark.slow
def test_a_group_cap_holds_across_workers_while_other_groups_run(
    settings: Settings, r: redis.Redis, spawn_worker: object
) -> None:
    app.configure(settings)
    with Client(settings=settings, app=app) as c:
        handles = [
            c.enqueue("free_job", [g], kwargs={"sleep": 0.15}, group=g)
            for _ in range(8)
            for g in ("g0", "g1", "g2", "g3")
        ]
        env = {"DTQ_GROUP_CONCURRENCY": "default=2"}
        procs = [
            spawn_worker(APP, settings, "--concurrency", "6", **env)  # type: ignore[operator]
            for _ in range(3)
        ]
        time.sleep(1.0)
        procs[0].signal(signal.SIGKILL)  # its runs are reclaimed: their places are not leaked
        for h in handles:
            assert c.result(h.id, timeout=90) is not None
        by: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for tag, s, e, _ in spans(settings, r):
            by[tag].append((s, e))
        peaks = {g: peak_overlap(v) for g, v in by.items()}
        assert max(peaks.values()) <= 2, peaks
        assert 2 in peaks.values(), "the race never reached the cap: test too weak"
        everything = [iv for v in by.values() for iv in v]
        assert peak_overlap(everything) > 2, "other groups did not run beside a capped one"
        wait_until(lambda: group_keys(r, settings) == [], 30)
        for p in procs[1:]:
            p.signal(signal.SIGTERM)
            assert p.wait(30) == 0


def test_a_paused_group_holds_only_itself(
    settings: Settings, r: redis.Redis, spawn_worker: object
) -> None:
    app.configure(settings)
    with Client(settings=settings, app=app) as c:
        assert c.pause_group("default", "held") is True
        held = [c.enqueue("free_job", ["held"], group="held") for _ in range(3)]
        other = [c.enqueue("free_job", ["other"], group="other") for _ in range(3)]
        plain = [c.enqueue("free_job", ["plain"]) for _ in range(3)]
        w = spawn_worker(APP, settings)  # type: ignore[operator]
        for h in [*other, *plain]:
            c.result(h.id, timeout=60)
        assert {c.get(h.id).status for h in held} == {TaskStatus.QUEUED}
        rows = {g.group: g for g in c.groups("default").items}
        assert rows["held"].paused and rows["held"].waiting == 3
        assert rows["held"].oldest_waiting_s is not None  # its withheld turn's list head
        assert c.resume_group("default", "held") is True
        for h in held:
            c.result(h.id, timeout=60)
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0
