"""Settings are validated at start: one line naming the setting, exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dtq import ConfigError
from dtq.settings import load_settings
from tests.conftest import ROOT


def test_defaults_match_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("DTQ_"):
            monkeypatch.delenv(k)
    s = load_settings()
    assert s.redis_url == "redis://localhost:6379/0"
    assert (s.key_prefix, s.queues, s.worker_concurrency) == ("dtq", ("default",), 16)
    assert (s.heartbeat_interval_s, s.visibility_timeout_s, s.drain_timeout_s) == (5, 30, 30)
    assert (s.retry_backoff_s, s.retry_backoff_max_s) == (1, 300)
    assert s.metrics_port is None and s.api_token is None
    assert s.worker_id.startswith("worker-") and len(s.worker_id) == 15
    assert s.result_ttl_s == 86400 and s.effective_heartbeat_ttl_s == 15


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DTQ_HEARTBEAT_INTERVAL_S": "30"}, "DTQ_HEARTBEAT_INTERVAL_S must be smaller"),
        ({"DTQ_WORKER_CONCURRENCY": "0"}, "DTQ_WORKER_CONCURRENCY"),
        ({"DTQ_WORKER_CONCURRENCY": "many"}, "DTQ_WORKER_CONCURRENCY"),
        ({"DTQ_REDIS_URL": "http://x"}, "DTQ_REDIS_URL: must start with redis://"),
        ({"DTQ_REDIS_URL": "redis+sentinel://h:26379"}, "DTQ_REDIS_URL: names no service"),
        ({"DTQ_REDIS_URL": "redis+sentinel://h/mymaster"}, "must be host:port"),
        ({"DTQ_REDIS_URL": "redis://host:port"}, "DTQ_REDIS_URL: bad port"),
        ({"DTQ_QUEUES": "a,,b b"}, "DTQ_QUEUES"),
        ({"DTQ_KEY_PREFIX": "a{b}"}, "DTQ_KEY_PREFIX"),
        ({"DTQ_METRICS_PORT": "70000"}, "DTQ_METRICS_PORT"),
    ],
)
def test_bad_values_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert message in str(exc.value) and "\n" not in str(exc.value)


def run_worker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "dtq_worker", *args],
        cwd=ROOT, env=e, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_worker_exit_code_2_on_bad_setting() -> None:
    p = run_worker("tests.apps.basic:app", DTQ_VISIBILITY_TIMEOUT_S="-1")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "DTQ_VISIBILITY_TIMEOUT_S" in p.stderr


def test_worker_exit_code_2_on_unimportable_app() -> None:
    p = run_worker("tests.apps.nope:app")
    assert p.returncode == 2 and "cannot import 'tests.apps.nope'" in p.stderr
    p = run_worker("tests.apps.basic:add")
    assert p.returncode == 2 and "is not a dtq.App" in p.stderr
    p = run_worker()
    assert p.returncode == 2 and "no APP given" in p.stderr


def test_worker_exit_code_2_on_schema_mismatch(redis_server: object, prefix: str) -> None:
    import redis

    redis.Redis.from_url(redis_server.url).set(f"{prefix}:schema", "999")  # type: ignore[attr-defined]
    p = run_worker(
        "tests.apps.basic:app",
        DTQ_REDIS_URL=redis_server.url,  # type: ignore[attr-defined]
        DTQ_KEY_PREFIX=prefix,
    )
    assert p.returncode == 2 and "schema version '999'" in p.stderr
