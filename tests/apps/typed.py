"""Tasks with typed parameters and results (docs/arguments.md): each checks that it was handed
the annotated types, and returns them, so a test sees both directions through a real worker."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import date, datetime, timedelta
from decimal import Decimal

from pydantic import BaseModel

from dtq import App

app = App()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str
    since: date


@dataclasses.dataclass
class Point:
    x: int
    when: datetime


@dataclasses.dataclass
class Echo:
    """Everything a typed task got, checked by type on the worker's side."""

    when: datetime
    day: date
    ident: uuid.UUID
    amount: Decimal
    blob: bytes
    color: Color
    address: Address
    point: Point
    points: list[Point]
    types: dict[str, str]


@app.task(name="typed.echo", max_retries=0)
def echo(
    when: datetime,
    day: date,
    ident: uuid.UUID,
    amount: Decimal,
    blob: bytes,
    color: Color,
    address: Address,
    point: Point,
    points: list[Point] | None = None,
) -> Echo:
    got = {"when": when, "day": day, "ident": ident, "amount": amount, "blob": blob,
           "color": color, "address": address, "point": point}  # fmt: skip
    return Echo(
        when, day, ident, amount, blob, color, address, point, points or [],
        {k: type(v).__name__ for k, v in got.items()},
    )  # fmt: skip


@app.task(name="typed.later", max_retries=3)
async def later(when: datetime, *, days: int = 1) -> datetime:
    return when + timedelta(days=days)


@app.task(name="typed.plain")
def plain(a: int, b: str, c: list[int], d: dict[str, float] | None = None) -> dict[str, int]:
    return {"a": a}
