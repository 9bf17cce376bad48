"""What a ``dtq-worker --processes N`` child does differently from a lone worker: its private
port file and a SIGTERM when its parent dies (docs/operations.md, "Worker processes"). Imports
nothing heavy: the worker's entry point imports it before the app."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PORT_FILE_ENV = "_DTQ_POOL_PORT_FILE"
PARENT_ENV = "_DTQ_POOL_PARENT"
_PR_SET_PDEATHSIG = 1
_PARENT_DIED_RT = 2  # the parent-death signal: SIGRTMIN + this (Linux)


def port_file() -> str | None:
    return os.environ.get(PORT_FILE_ENV) or None


def publish_port(path: str, port: int) -> None:
    """Write the port atomically: the parent never reads half a number."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(str(port))
    tmp.replace(path)


def read_port(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def pid_gone(pid: str) -> bool:
    """Whether no process ``pid`` exists on this host (one of another user's does)."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def _parent_died(sig: int, _frame: object) -> None:
    signal.signal(sig, signal.SIG_IGN)  # repeated as each of the parent's threads exits
    os.kill(os.getpid(), signal.SIGTERM)  # one stop: the worker drains


def follow_parent() -> None:
    """In a pool child: one SIGTERM when the parent dies (Linux only; elsewhere a no-op)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    died = signal.SIGRTMIN + _PARENT_DIED_RT
    signal.signal(died, _parent_died)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, died)
    except (OSError, AttributeError):  # pragma: no cover - no prctl: the child stays on its own
        return
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
