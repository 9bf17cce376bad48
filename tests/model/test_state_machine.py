"""The model test: dtq's Lua scripts on a real redis-server driven through random sequences of
every transition, with lost replies and error replies, the invariants of docs/design.md
("Invariants the model checks") checked after every step (tests/model/machine.py).

CI runs a bounded, derandomized profile (a red run is reproducible); ``make model`` runs as many
examples as asked (``make model MODEL_EXAMPLES=20000``; ``MODEL_SEED`` picks another
sequence of examples).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import DtqModel
from tests.redis_server import RedisServer


def model_settings() -> settings:
    """CI: bounded and derandomized. ``DTQ_MODEL_EXAMPLES``: that many examples, randomized
    (``DTQ_MODEL_SEED`` fixes the seed)."""
    examples = int(os.environ.get("DTQ_MODEL_EXAMPLES", "0"))
    steps = int(os.environ.get("DTQ_MODEL_STEPS", "40"))
    common = dict(
        deadline=None, stateful_step_count=steps, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )  # fmt: skip
    if examples:
        return settings(max_examples=examples, derandomize=False, **common)  # type: ignore[arg-type]
    return settings(max_examples=300, derandomize=True, **common)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model_redis() -> Iterator[redis.Redis]:
    """A redis-server of the model's own: every example starts from an empty database."""
    server = RedisServer().start()
    yield redis.Redis(port=server.port, decode_responses=True)
    server.cleanup()


def test_the_scripts_keep_the_invariants(model_redis: redis.Redis) -> None:
    DtqModel.r = model_redis
    seed = os.environ.get("DTQ_MODEL_SEED")
    if seed:
        from hypothesis import seed as fix_seed

        fix_seed(int(seed))(DtqModel.TestCase)
    run_state_machine_as_test(DtqModel, settings=model_settings())
