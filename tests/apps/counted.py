"""tests.apps.basic's app, from a module that counts its imports: each process that imports it
appends its pid to the file ``DTQ_TEST_IMPORTS`` names (a forked pool child imports nothing)."""

from __future__ import annotations

import os

from tests.apps.basic import app

_imports = os.environ.get("DTQ_TEST_IMPORTS")
if _imports:
    with open(_imports, "a") as fh:
        fh.write(f"{os.getpid()}\n")

__all__ = ["app"]
