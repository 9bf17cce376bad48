"""Two versions of one app sharing a queue during a rolling deploy (tests/worker/test_rollout.py):
``v1`` knows task ``a`` and schedule ``s-a``; ``v2`` also knows task ``b`` and schedule ``s-b``."""

from __future__ import annotations

from dtq import App

v1 = App()
v2 = App()


@v1.periodic(every=3600, name="s-a")
@v1.task(name="a")
async def a_v1() -> str:
    return "a1"


@v2.periodic(every=3600, name="s-a")
@v2.task(name="a")
async def a_v2() -> str:
    return "a2"


@v2.periodic(every=3600, name="s-b")
@v2.task(name="b")
async def b(i: int) -> int:
    return i
