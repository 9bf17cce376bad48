"""The enqueue options are listed once, in :class:`dtq.sdk.requests.EnqueueOptions`: every other
spelling of them is derived from it or checked against it here (a drift fails by name)."""

from __future__ import annotations

import inspect
import typing
from dataclasses import fields

import pytest

from dtq.app import App
from dtq.cli import enqueue as cli_enqueue
from dtq.schedules import Schedule, periodic
from dtq.sdk.client import AsyncClient, Client
from dtq.sdk.requests import (
    ENQUEUE_FIELDS,
    ENQUEUE_OPTIONS,
    SCHEDULE_OPTIONS,
    EnqueueOptions,
    build_task,
)
from dtq.task import Task
from dtq.workflows import STEP_OPTIONS
from dtq_api.schemas import EnqueueRequest

OPTIONS = {k: v.__forward_arg__ for k, v in EnqueueOptions.__annotations__.items()}


def _keywords(fn: typing.Callable[..., typing.Any]) -> dict[str, str]:
    return {
        n: str(p.annotation)
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_the_list() -> None:
    assert set(OPTIONS) == ENQUEUE_OPTIONS
    assert {"name", "args", "kwargs", *ENQUEUE_OPTIONS} == ENQUEUE_FIELDS
    assert {"queue", "priority", "delay", "idempotency_key", "group"} <= ENQUEUE_OPTIONS


def test_build_task_checks_each_option_with_its_type() -> None:
    kw = _keywords(build_task)
    assert kw.pop("defaults") and kw.pop("headers")  # (not options: the app's, middleware's)
    assert kw == OPTIONS


@pytest.mark.parametrize("client", [Client, AsyncClient])
def test_the_clients_take_the_options_as_keywords(client: type) -> None:
    by_name = typing.get_overloads(client.enqueue)[1]
    params = inspect.signature(by_name).parameters
    assert str(params["options"].annotation) == "Unpack[EnqueueOptions]"
    assert str(inspect.signature(Task.options).parameters["options"].annotation) == (
        "Unpack[EnqueueOptions]"
    )


def test_the_api_body_has_the_enqueue_fields() -> None:
    assert set(EnqueueRequest.model_fields) == ENQUEUE_FIELDS


def test_the_cli_has_a_flag_for_each_option() -> None:
    names = {p.name for p in cli_enqueue.params}
    assert {n.removesuffix("_json") for n in names} >= ENQUEUE_OPTIONS


def test_steps_and_schedules_take_subsets() -> None:
    assert STEP_OPTIONS <= ENQUEUE_OPTIONS
    assert {f.name for f in fields(Schedule)} & ENQUEUE_OPTIONS == SCHEDULE_OPTIONS
    assert set(_keywords(periodic)) & ENQUEUE_OPTIONS == SCHEDULE_OPTIONS
    assert set(_keywords(App.periodic)) & ENQUEUE_OPTIONS == SCHEDULE_OPTIONS
