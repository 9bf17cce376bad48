"""Fixtures of the operator tests: ``dtq`` runs the CLI in-process (its main with argv) and
returns the exit code and what it printed; ``client`` is a blocking Client on the test's Redis."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from dtq import Client, Settings
from dtq.cli import main


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def dtq(settings: Settings, capsys: Any, monkeypatch: Any) -> Any:
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)

    def run(*argv: str, stdin: str = "") -> Run:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(argv))
        out, err = capsys.readouterr()
        return Run(int(exc.value.code or 0), out, err)

    return run


@pytest.fixture
def client(settings: Settings) -> Any:
    with Client(settings=settings) as c:
        yield c
