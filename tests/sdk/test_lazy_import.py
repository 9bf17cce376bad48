"""``import dtq`` loads nothing of the SDK until a public name is used, and every public name
still resolves, to the object its home module defines (dtq/__init__.py's PEP 562 ``__getattr__``).
Each check runs in a fresh interpreter: this test process has imported everything long ago."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dtq

INIT = Path(dtq.__file__)


def _python(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_import_dtq_loads_no_sdk_module() -> None:
    loaded = _python(
        "import json, sys, dtq; print(json.dumps(sorted(m for m in sys.modules"
        " if m.startswith(('dtq.', 'redis', 'pydantic', 'msgspec')))))"
    )
    assert loaded == []


def test_a_submodule_import_loads_only_what_it_needs() -> None:
    # The worker and the API import submodules (dtq.errors, dtq.store.keys, ...): going through
    # dtq/__init__.py must not drag in the client, the app or the workflows.
    loaded = _python(
        "import json, sys, dtq.errors; print(json.dumps(sorted(m for m in sys.modules"
        " if m.startswith('dtq'))))"
    )
    assert loaded == ["dtq", "dtq.errors"]


def test_every_public_name_resolves_to_its_home_object() -> None:
    got = _python(
        "import importlib, json, dtq\n"
        "out = {}\n"
        "for name in dtq.__all__:\n"
        "    home = dtq._HOMES[name]\n"
        "    out[name] = getattr(dtq, name) is getattr(importlib.import_module(home), name)\n"
        "print(json.dumps(out))"
    )
    assert got == dict.fromkeys(dtq.__all__, True)


def test_from_dtq_import_star_and_dir() -> None:
    got = _python(
        "import json, dtq\n"
        "ns = {}\n"
        "exec('from dtq import *', ns)\n"
        "print(json.dumps([sorted(set(ns) - {'__builtins__'}), sorted(dir(dtq))]))"
    )
    assert isinstance(got, list)
    star, listing = got
    assert star == sorted(dtq.__all__)
    assert set(dtq.__all__) <= set(listing)


def test_all_homes_and_the_type_checking_imports_agree() -> None:
    # Type checkers read the `if TYPE_CHECKING:` imports; the runtime reads _HOMES. A name added
    # to one and not the other would type-check and fail at run time (or the reverse).
    tree = ast.parse(INIT.read_text())
    guarded = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == dtq._HOMES
    assert sorted(dtq.__all__) == sorted(dtq._HOMES)


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        _ = dtq.Clinet  # type: ignore[attr-defined]
    from dtq import codec  # a submodule, not a public name: imported as before

    assert codec.__name__ == "dtq.codec"


def test_text_logging_does_not_load_the_json_formatter() -> None:
    # python-json-logger is needed for DTQ_LOG_FORMAT=json only.
    got = _python(
        "import json, sys\n"
        "from dtq import logs\n"
        "logs.setup('text')\n"
        "text = 'pythonjsonlogger' in sys.modules\n"
        "logs.setup('json')\n"
        "print(json.dumps([text, 'pythonjsonlogger' in sys.modules]))"
    )
    assert got == [False, True]


def test_the_worker_loads_neither_the_client_nor_json_logging_at_start() -> None:
    # A worker needs the client only when a task enqueues (the App makes it on first use).
    loaded = _python(
        "import json, sys, dtq_worker.main, dtq_worker.worker; print(json.dumps(sorted("
        "m for m in ('dtq.sdk.client', 'pythonjsonlogger')"
        " if m in sys.modules)))"
    )
    assert loaded == []
