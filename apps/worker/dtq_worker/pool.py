"""``dtq-worker APP --processes N``: a parent that supervises N full worker processes
(docs/operations.md, "Worker processes"; when a fork is safe: poolfork.py)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from dtq.errors import ConfigError
from dtq.settings import WORKER_ID_RE, Settings
from dtq_worker import poolchild, poolfork
from dtq_worker.health import HealthServer
from dtq_worker.poolhttp import ChildView, PoolEndpoints
from dtq_worker.worker import EXIT_CONFIG, EXIT_OK, EXIT_REDIS_LOST

log = logging.getLogger("dtq.worker.pool")

RESTART_LIMIT = 5
STABLE_S = 30.0
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 10.0
TICK_S = 0.05
LOOP_STALE_S = 5.0  # the parent's loop is live when it turned within this
KILL_GRACE_S = 10.0  # after the children's drain and hard exit deadlines: SIGKILL

DIR_PREFIX = "dtq-pool-"  # then the parent's pid: a dead parent's directory is removed
_CLEAN = {EXIT_OK, -signal.SIGTERM, -signal.SIGINT}  # a child stopped before its handlers


def child_ids(settings: Settings, n: int) -> list[str | None]:
    """Each child's worker id: ``<id>-<i>`` when one was given, else None (it makes its own)."""
    if "worker_id" not in settings.model_fields_set:
        return [None] * n
    last = f"{settings.worker_id}-{n - 1}"
    if not WORKER_ID_RE.fullmatch(last):
        raise ConfigError(
            f"DTQ_WORKER_ID {settings.worker_id!r} is too long for {n} processes "
            f"({last!r} exceeds 64 characters)"
        )
    return [f"{settings.worker_id}-{i}" for i in range(n)]


def _remove_stale_dirs() -> None:
    """Remove the port directories of parents that died without cleaning up (SIGKILL)."""
    for d in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        if poolchild.pid_gone(d.name.removeprefix(DIR_PREFIX).split("-", 1)[0]):
            shutil.rmtree(d, ignore_errors=True)


@dataclass
class Slot:
    index: int
    worker_id: str | None
    port_file: Path | None
    proc: subprocess.Popen[bytes] | poolfork.Forked | None = None
    started: float = 0.0
    short_deaths: int = 0
    restart_at: float | None = None
    codes: list[int] = field(default_factory=list)


class Pool:
    def __init__(self, settings: Settings, argv: list[str], n: int, entry: poolfork.Entry) -> None:
        self.settings = settings
        self.entry = entry  # what a forked child runs (main.forked_child)
        self.argv = argv
        self.n = n
        self.stopping = False
        self.code: int | None = None  # decided early: give-up (1) or a child's config error (2)
        self.restarts = 0
        self.tick = time.monotonic()
        self._signals: list[int] = []
        # (a child that cannot reach Redis exits after one heartbeat TTL: a quick death too)
        self.stable_s = max(STABLE_S, 2 * settings.effective_heartbeat_ttl_s)
        self._stop_at: float | None = None
        _remove_stale_dirs()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        ids = child_ids(settings, n)
        publish = settings.metrics_port is not None
        self.slots = [
            Slot(i, ids[i], self._dir / f"{i}.port" if publish else None) for i in range(n)
        ]
        self.endpoints = PoolEndpoints(
            self._views, self._live, lambda: self.stopping, lambda: self.restarts
        )
        self.http: HealthServer | None = None

    # --- probes' view -------------------------------------------------------------------------

    def _views(self) -> list[ChildView]:
        out = []
        for s in self.slots:
            port = None
            if s.port_file is not None and s.proc is not None and s.proc.poll() is None:
                port = poolchild.read_port(s.port_file)
            out.append(ChildView(s.index, port))
        return out

    def _live(self) -> str:
        age = time.monotonic() - self.tick
        return "ok" if age < LOOP_STALE_S else f"supervision loop stalled {age:.0f}s"

    # --- children -----------------------------------------------------------------------------

    def _env(self, slot: Slot) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("DTQ_METRICS_PORT", None)  # the parent serves it
        env.pop(poolchild.PORT_FILE_ENV, None)
        env[poolchild.PARENT_ENV] = str(os.getpid())
        if slot.port_file is not None:
            env[poolchild.PORT_FILE_ENV] = str(slot.port_file)
        return env

    def _start(self, slot: Slot) -> None:
        args = [*self.argv, "--processes", "1"]  # (the last one given wins)
        if slot.worker_id is not None:
            args += ["--worker-id", slot.worker_id]
        if slot.port_file is not None:
            slot.port_file.unlink(missing_ok=True)
        env, how = self._env(slot), "fork" if poolfork.can_fork() else "fresh interpreter"
        if how == "fork":
            slot.proc = poolfork.fork_worker(args, env, self._close_in_child, self.entry)
        else:
            cmd = [sys.executable, "-m", "dtq_worker", *args]
            slot.proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        slot.started = time.monotonic()
        slot.restart_at = None
        log.info(
            "process %d started (%s): pid %d%s",
            slot.index,
            how,
            slot.proc.pid,
            f", worker id {slot.worker_id}" if slot.worker_id else "",
        )

    def _close_in_child(self) -> None:
        if self.http is not None:
            self.http.close_in_child()

    def _reaped(self, slot: Slot, code: int) -> None:
        """Slot's child ended with ``code``: decide what follows."""
        slot.proc = None
        slot.codes.append(code)
        self.endpoints.retire(slot.index)
        if slot.port_file is not None:
            slot.port_file.unlink(missing_ok=True)
        if self.stopping:
            log.info("process %d stopped (exit %d)", slot.index, code)
            return
        lived = time.monotonic() - slot.started
        if code == EXIT_CONFIG:
            log.error("process %d exited 2 (bad configuration): stopping all", slot.index)
            self.code = EXIT_CONFIG
            self._begin_stop(signal.SIGTERM)
            return
        slot.short_deaths = slot.short_deaths + 1 if lived < self.stable_s else 0
        if slot.short_deaths >= RESTART_LIMIT:
            log.error(
                "process %d died %d times in a row within %.0fs of its start (last exit %d): "
                "giving up",
                slot.index,
                slot.short_deaths,
                self.stable_s,
                code,
            )
            self.code = EXIT_REDIS_LOST
            self._begin_stop(signal.SIGTERM)
            return
        delay = float(min(BACKOFF_BASE_S * 2**slot.short_deaths, BACKOFF_MAX_S))
        log.warning(
            "process %d died (exit %d) after %.1fs: restarting in %.2fs",
            slot.index,
            code,
            lived,
            delay,
        )
        slot.restart_at = time.monotonic() + delay

    # --- signals and stop ---------------------------------------------------------------------

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        self._signals.append(sig)

    def _begin_stop(self, sig: int) -> None:
        if not self.stopping:
            s = self.settings
            self._stop_at = time.monotonic() + s.drain_timeout_s + s.hard_exit_s + KILL_GRACE_S
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.poll() is None:
                os.kill(slot.proc.pid, sig)

    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            name = signal.Signals(sig).name
            if not self.stopping:
                log.info("%s: stopping %d processes (drain)", name, self.n)
            else:
                log.warning("second %s: processes skip their drain", name)
            self._begin_stop(sig)

    def _final_code(self) -> int:
        if self.code is not None:
            return self.code
        last = [s.codes[-1] for s in self.slots if s.codes]
        if EXIT_CONFIG in last:
            return EXIT_CONFIG
        if any(c not in _CLEAN for c in last):
            return EXIT_REDIS_LOST
        return EXIT_OK

    # --- the loop -----------------------------------------------------------------------------

    def run(self, early_signals: list[int]) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._signals.extend(early_signals)
        try:
            if self.settings.metrics_port is not None:
                reg = CollectorRegistry(auto_describe=False)
                reg.register(self.endpoints)
                self.http = HealthServer(reg, self.endpoints.live, self.endpoints.ready)
                try:
                    self.http.bind(self.settings.metrics_port)
                except ConfigError as exc:  # the port is taken: before any child starts
                    print(f"dtq-worker: {exc}", file=sys.stderr)
                    return EXIT_CONFIG
            if not self._signals:
                log.info("starting %d worker processes", self.n)
                for slot in self.slots:
                    self._start(slot)
            if self.http is not None:  # its thread after the first forks (poolfork.py)
                self.http.serve()
            self._loop()
            return self._final_code()
        finally:
            self._cleanup()

    def _loop(self) -> None:
        while True:
            self.tick = now = time.monotonic()
            self._handle_signals()
            for slot in self.slots:
                if slot.proc is not None and (code := slot.proc.poll()) is not None:
                    self._reaped(slot, code)
            self._handle_signals()
            if self.stopping:
                if all(s.proc is None for s in self.slots):
                    return
                if self._stop_at is not None and now > self._stop_at:
                    for s in self.slots:
                        if s.proc is not None and s.proc.poll() is None:
                            log.error("process %d still runs past its deadlines: killing", s.index)
                            s.proc.kill()
                    self._stop_at = None
            else:
                for slot in self.slots:
                    if slot.restart_at is not None and now >= slot.restart_at:
                        self.restarts += 1
                        self._start(slot)
            time.sleep(TICK_S)

    def _cleanup(self) -> None:
        for slot in self.slots:  # only reached with children alive on an unexpected error
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        if self.http is not None:
            self.http.stop()
        self.endpoints.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def run_pool(
    settings: Settings, argv: list[str], early_signals: list[int], entry: poolfork.Entry
) -> int:
    """Supervise ``settings.worker_processes`` workers started with ``argv`` (a forked one
    runs ``entry``: main.forked_child); the exit code."""
    try:
        pool = Pool(settings, argv, settings.worker_processes, entry)
    except OSError as exc:  # no writable temporary directory
        print(f"dtq-worker: cannot create the processes' port directory: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return pool.run(early_signals)
