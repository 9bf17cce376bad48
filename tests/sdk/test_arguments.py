"""Arguments beyond bare JSON (docs/arguments.md): datetime, date, UUID, Decimal, bytes, enums,
pydantic models and dataclasses are sent as plain JSON and handed to the task as the types its
parameters name; a typed handle's result comes back as the task's return type."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from dtq import App, AsyncClient, Client, SerializationError, Settings, TaskFailed, codec
from tests.apps.typed import Address, Color, Echo, Point, app, echo
from tests.conftest import running_worker

WHEN = datetime(2026, 11, 30, 8, 15, 1, 250_000, tzinfo=UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


@dataclasses.dataclass
class Reading:
    value: float


# (value, its type, the JSON other languages and the HTTP API see)
ROUND_TRIPS: list[tuple[Any, Any, Any]] = [
    (WHEN, datetime, "2026-11-30T08:15:01.250000Z"),
    (datetime(2026, 1, 2, 3, 4, 5), datetime, "2026-01-02T03:04:05"),  # naive stays naive
    (date(2026, 2, 28), date, "2026-02-28"),
    (ID, uuid.UUID, "12345678-1234-5678-1234-567812345678"),
    (Decimal("0.10"), Decimal, "0.10"),  # its text: no float rounding, trailing zero kept
    (Decimal("-1E+3"), Decimal, "-1E+3"),
    (b"\x00\xffbin", bytes, "AP9iaW4="),  # base64
    (b"", bytes, ""),
    (Color.BLUE, Color, "blue"),
    (
        Address(city="Lyon", since=date(2020, 5, 1)),
        Address,
        {"city": "Lyon", "since": "2020-05-01"},
    ),
    (Point(3, WHEN), Point, {"x": 3, "when": "2026-11-30T08:15:01.250000Z"}),
    ([Point(1, WHEN)], list[Point], [{"x": 1, "when": "2026-11-30T08:15:01.250000Z"}]),
    ({"a": ID}, dict[str, uuid.UUID], {"a": str(ID)}),
    (timedelta(seconds=90), timedelta, "PT90S"),
]


@pytest.mark.parametrize(("value", "tp", "wire"), ROUND_TRIPS, ids=lambda v: repr(v)[:30])
def test_each_type_round_trips_through_plain_json(value: Any, tp: Any, wire: Any) -> None:
    text = codec.dumps([value], "args")
    assert json.loads(text) == [wire]  # what other languages see: plain JSON
    back = codec.convert(json.loads(text)[0], tp)
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (object(), "must be JSON-serializable.*object"),
        (float("nan"), "must be JSON-serializable"),
        (math.inf, "must be JSON-serializable"),
        ({"x": [1, float("-inf")]}, "must be JSON-serializable"),
        ((None, {"y": (1, math.nan)}), "must be JSON-serializable"),
        (Reading(math.nan), "must be JSON-serializable"),  # inside a dataclass too
        ("\ud800", "is not valid Unicode"),
        ({None: 1}, "must be JSON-serializable"),
        ({1j: 1}, "must be JSON-serializable"),
        (lambda: 1, "must be JSON-serializable"),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_what_cannot_be_encoded_is_refused_clearly(value: Any, why: str) -> None:
    with pytest.raises(SerializationError, match=f"args {why}"):
        codec.dumps([value], "args")


def test_enqueue_refuses_an_unencodable_argument_before_sending(settings: Settings) -> None:
    with Client(settings=settings, app=app) as c:
        with pytest.raises(SerializationError, match="kwargs must be JSON-serializable"):
            c.enqueue("typed.echo", [], {"when": {1, 2j}})
        with pytest.raises(SerializationError, match="args must be JSON-serializable"):
            c.enqueue("typed.later", [float("nan")])


def test_plain_json_parameters_cost_no_conversion() -> None:
    """Precomputed at registration: a task of plain JSON parameters converts nothing per call."""
    assert app.tasks["typed.plain"].arg_types is None
    assert app.tasks["typed.echo"].arg_types is not None
    local = App()

    @local.task
    def untyped(a, b=None):  # type: ignore[no-untyped-def]
        return a

    assert local.tasks[untyped.name].arg_types is None


def _echo_args() -> dict[str, Any]:
    return {
        "when": WHEN, "day": date(2026, 2, 28), "ident": ID, "amount": Decimal("12.30"),
        "blob": b"\x00\x01\xfe", "color": Color.RED,
        "address": Address(city="Oslo", since=date(2019, 1, 1)), "point": Point(7, WHEN),
    }  # fmt: skip


def test_worker_hands_each_argument_as_its_annotated_type(
    spawn_worker: Any, settings: Settings
) -> None:
    spawn_worker("tests.apps.typed:app", settings)
    kw = _echo_args()
    with Client(settings=settings, app=app) as c:
        # Half positional, half by name, as a caller would mix them.
        pos = [kw.pop("when"), kw.pop("day"), kw.pop("ident"), kw.pop("amount")]
        h = c.enqueue(echo, *pos, **kw, points=[Point(1, WHEN), Point(2, WHEN)])
        got = c.result(h, timeout=60)
        stored = c.get(h.id)
    assert isinstance(got, Echo)
    assert got.types == {
        "when": "datetime", "day": "date", "ident": "UUID", "amount": "Decimal",
        "blob": "bytes", "color": "Color", "address": "Address", "point": "Point",
    }  # fmt: skip
    assert (got.when, got.amount, got.blob, got.color) == (
        WHEN,
        Decimal("12.30"),
        b"\x00\x01\xfe",
        Color.RED,
    )
    assert got.address == Address(city="Oslo", since=date(2019, 1, 1))
    assert got.points == [Point(1, WHEN), Point(2, WHEN)]
    # The record holds plain JSON: what the HTTP API and other languages read.
    assert stored.args[0] == "2026-11-30T08:15:01.250000Z" and stored.args[2] == str(ID)
    assert stored.kwargs["blob"] == "AAH+" and stored.kwargs["color"] == "red"
    assert stored.result["when"] == "2026-11-30T08:15:01.250000Z"
    assert stored.result["amount"] == "12.30"


async def test_result_is_decoded_by_the_return_type(settings: Settings) -> None:
    from tests.apps.typed import later

    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue(later, WHEN, days=2)
        got = await c.result(h, timeout=30)
        assert got == WHEN + timedelta(days=2) and isinstance(got, datetime)
        # By id (a str), the result is what was stored: plain JSON.
        assert await c.result(h.id, timeout=30) == "2026-12-02T08:15:01.250000Z"
        # Enqueued by name from elsewhere (the HTTP API, another language): ISO text, decoded.
        h2 = await c.enqueue("typed.later", ["2026-01-01T00:00:00+00:00"])
        assert await c.result(h2.id, timeout=30) == "2026-01-02T00:00:00Z"


async def test_an_argument_not_of_its_type_fails_the_task_naming_it(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("typed.later", ["not a date"])
        with pytest.raises(TaskFailed) as err:
            await c.result(h.id, timeout=30)
        info = await c.get(h.id)
    assert "argument 'when' cannot be read as datetime" in str(err.value)
    assert info.failures == 1  # not retried: another attempt would read it the same way


def test_var_positional_and_keyword_annotations_apply_to_each_extra_argument() -> None:
    local = App()

    @local.task
    def spread(first: int, *days: date, **ids: uuid.UUID) -> None: ...

    types = local.tasks[spread.name].arg_types
    assert types is not None
    args, kwargs = types.decode([1, "2026-01-01", "2026-01-02"], {"a": str(ID)})
    assert args == [1, date(2026, 1, 1), date(2026, 1, 2)] and kwargs == {"a": ID}


def test_an_annotation_defined_after_the_task_is_resolved_at_its_first_call() -> None:
    ns: dict[str, Any] = {}
    exec(  # a module whose task names a type defined below it
        "from __future__ import annotations\n"
        "from dtq import App\n"
        "app = App()\n"
        "@app.task(name='f')\n"
        "def f(d: Later) -> None: ...\n"
        "import datetime\n"
        "Later = datetime.date\n",
        ns,
    )
    types = ns["app"].tasks["f"].arg_types
    assert types is not None  # not mistaken for a plain parameter
    assert types.decode(["2026-03-04"], {}) == ([date(2026, 3, 4)], {})


def test_test_queue_converts_arguments_as_the_worker_does() -> None:
    from dtq.testing import TestQueue

    with TestQueue(app) as tq:
        from tests.apps.typed import later

        h = later.enqueue(WHEN, days=1)
        [info] = tq.drain()
        assert info.status == "succeeded"
        assert tq.client.result(h, timeout=1) == WHEN + timedelta(days=1)


class Own:
    """A class of the user's own: nothing dtq can build from JSON."""


def test_a_parameter_of_a_type_dtq_cannot_build_gets_what_json_gave() -> None:
    """A class of the user's own or a Callable was handed the JSON value before dtq converted
    anything; it still is (no task that worked before starts failing)."""

    local = App()

    @local.task
    def f(a: Own, b: Callable[[], int], when: datetime) -> Own: ...  # type: ignore[empty-body]

    types = local.tasks[f.name].arg_types
    assert types is not None
    got = types.decode([{"k": 1}, "x", "2026-01-01T00:00:00Z"], {})  # the datetime still is
    assert got == ([{"k": 1}, "x", datetime(2026, 1, 1, tzinfo=UTC)], {})
    assert local.tasks[f.name].decode_result({"k": 1}) == {"k": 1}
