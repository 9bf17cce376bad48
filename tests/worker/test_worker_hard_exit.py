"""The hard-exit deadline ends the process. A worker process (dtq-worker) that reaches it after
its drain exits 0 as a drained one would (test_faults.test_hard_exit_deadline); a worker run
inside another program (the tests' in-process workers) must end its host with a failure: a
test that hangs past the deadline must not make pytest exit 0."""

from __future__ import annotations

import os
from typing import Any

import pytest

from dtq import App
from dtq_worker.worker import EXIT_OK, Worker
from tests.conftest import make_settings


def _worker() -> Worker:
    s = make_settings("redis://127.0.0.1:1/0", "hardexit")
    return Worker(App(s), s)


def test_an_in_process_worker_past_its_hard_exit_deadline_ends_its_host_with_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codes: list[Any] = []
    monkeypatch.setattr(os, "_exit", codes.append)
    _worker()._hard_exit()
    assert len(codes) == 1 and codes[0] != EXIT_OK


def test_a_worker_process_past_its_hard_exit_deadline_exits_as_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codes: list[Any] = []
    monkeypatch.setattr(os, "_exit", codes.append)
    w = _worker()
    w.owns_process()
    w._hard_exit()
    assert codes == [EXIT_OK]
