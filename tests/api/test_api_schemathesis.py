"""Schema-driven fuzzing of dtq-api with schemathesis against its own /openapi.json.

Every operation (except the endless SSE stream) gets generated valid (positive) and invalid
(negative) requests; each answer must be documented (status code, content type, body schema)
and never a server error. Runs against a real dtq-api process on a private Redis, with data in
place. (Driven through Hypothesis directly: schemathesis' lazy pytest fixture does not run on
pytest 9.) Examples per operation and mode: DTQ_SCHEMATHESIS_EXAMPLES (default 20).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig

from dtq import Client, Settings
from tests.api_proc import ApiProc

# CI runs a short pass; DTQ_SCHEMATHESIS_EXAMPLES=500 (or more) makes a run of several minutes.
EXAMPLES = int(os.environ.get("DTQ_SCHEMATHESIS_EXAMPLES", "20"))


# A body past DTQ_API_MAX_BODY_BYTES is rejected with 413 (documented): a rejection too.
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [
        400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]}}}
)  # fmt: skip


def within_clock_bounds(case: Any) -> None:
    """An ``eta`` must lie within 10 years of now (422 otherwise, as documented): a rule on the
    clock that JSON Schema cannot state, so a valid request gets a valid time."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("eta"), str):
        body["eta"] = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()


@contextlib.contextmanager
def no_collection_inside_ast_builds() -> Iterator[None]:
    """Automatic garbage collection off while Hypothesis runs (an explicit ``gc.collect()``
    between operations keeps memory bounded).

    Why: on CPython before 3.11.8 / 3.12.2 (gh-106905, fixed by gh-113035) the AST
    constructor keeps its recursion depth in state shared by every thread. Hypothesis and
    schemathesis build ASTs all the time (``ast.parse`` of lambdas, of the test's source for
    its seed, of local modules for constants), and Hypothesis registers a ``gc.callbacks``
    hook (to time collections): a collection inside an AST build runs that Python hook, the
    GIL can pass to another thread building an AST, and the first build then fails with
    ``SystemError: AST constructor recursion depth mismatch``. With automatic collection
    off, an AST build never runs Python code, so never lets another build in: no race, on
    any thread. (Reproduced on 3.11.7 with 8 threads parsing and a Python gc callback: 13
    SystemErrors in 5 rounds; none with collection off.)
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def fuzz(op: Any, mode: schemathesis.GenerationMode) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @hsettings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
    def check(case: Any) -> None:
        if mode is schemathesis.GenerationMode.POSITIVE:
            within_clock_bounds(case)
        case.call_and_validate()

    check()


@pytest.mark.slow
def test_api_conforms_to_its_openapi(settings: Settings) -> None:
    api = ApiProc(settings)
    try:
        with Client(settings=settings) as c:
            c.enqueue("add", [1, 2])
            c.enqueue("add", [1, 2], delay=600)
        schema = schemathesis.openapi.from_url(api.url + "/openapi.json", config=CONFIG)
        schema = schema.exclude(path="/api/v1/events")
        ran: list[str] = []
        errors: list[str] = []
        with no_collection_inside_ast_builds():
            for result in schema.get_all_operations():
                op = result.ok()
                for mode in schemathesis.GenerationMode:
                    gc.collect()  # here, where this thread builds no AST
                    try:
                        fuzz(op, mode)
                    except Unsatisfiable:
                        # No invalid request exists for an operation without inputs.
                        assert mode is schemathesis.GenerationMode.NEGATIVE, op.path
                        continue
                    except Exception as exc:
                        errors.append(f"{op.method.upper()} {op.path} ({mode.value}): {exc}")
                    ran.append(f"{op.method} {op.path} {mode.value}")
        assert len(ran) >= 30  # 21 operations, positive and negative where inputs exist
        assert not errors, "\n\n".join(errors)
        assert "Traceback" not in api.output()
    finally:
        api.close()
