"""How a ``--processes`` parent starts a child: a fork of itself when that is safe (one thread:
:func:`can_fork`), else a fresh ``python -m dtq_worker`` (docs/operations.md, "Worker processes").
A forked child runs ``main.forked_child`` and leaves with ``os._exit``."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

_STOPS = {signal.SIGTERM, signal.SIGINT}


def can_fork() -> bool:
    """One thread runs (the kernel's count on Linux, C extensions' threads included)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = threading.active_count()
    return hasattr(os, "fork") and threads == 1


class Forked:
    """A forked child, with the part of ``subprocess.Popen`` the pool uses. Its exit status is
    collected once, under a lock: the parent's HTTP thread polls too."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:  # (a thread that finds it held: the other one is collecting it)
                if self.returncode is None:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self) -> int:
        with self._lock:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


Entry = Callable[[list[str], Callable[[], None]], None]
"""A forked child's entry point: called with the child's arguments and ``unblock`` (lets the
signals blocked across the fork in, once the child's own handlers are installed)."""


def fork_worker(
    args: list[str], env: dict[str, str], close: Callable[[], None], entry: Entry
) -> Forked:
    """Fork a child that runs ``entry`` (``dtq-worker ARGS``) with ``env`` as its environment, in
    a session of its own; ``close()`` runs first in the child (the parent's listening socket)."""
    for stream in (sys.stdout, sys.stderr):  # buffered output would be written twice
        stream.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:
        _child(args, env, close, mask, entry)  # never returns
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return Forked(pid)


def _child(
    args: list[str],
    env: dict[str, str],
    close: Callable[[], None],
    mask: set[int | signal.Signals],
    entry: Entry,
) -> NoReturn:
    code = 1
    try:
        os.setsid()
        close()
        for key in set(os.environ) - set(env):
            del os.environ[key]
        os.environ.update(env)

        def unblock() -> None:  # (the parent's handlers are the pool's: entry replaces them first)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        try:
            entry(args, unblock)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        atexit._run_exitfuncs()  # what a fresh interpreter runs at its exit (the app's too)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
                stream.flush()
        os._exit(code)


def _exit_code(code: object) -> int:
    """The process exit code ``sys.exit(code)`` stands for, as the interpreter reads it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
