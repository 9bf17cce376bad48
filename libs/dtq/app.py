"""``dtq.App``: the registry of task functions (:class:`dtq.task.Task`) and middleware a worker
runs and a client enqueues. It builds its own clients; a client is given an App and reads its
hooks and defaults from the object (it never imports this module)."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

from dtq.errors import ConfigError, InvalidRequest
from dtq.limits import Limit
from dtq.middleware import Hooks, check_middleware
from dtq.sdk.requests import DEFAULT_MAX_RETRIES, DEFAULT_PRIORITY, TaskDefaults, check_task_name
from dtq.settings import Settings, check_queue_name, load_settings
from dtq.task import Task

if TYPE_CHECKING:
    from dtq.sdk.client import AsyncClient, Client

P = ParamSpec("P")
R = TypeVar("R")


class _Register(Protocol):
    """What ``@app.task(...)`` returns: registers a function; an async one's handle is typed by
    what its coroutine returns."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class App:
    """Holds settings and the task registry. Settings come from the environment unless given.

    ``tracing=True`` (or ``DTQ_TRACING=1``) adds OpenTelemetry spans for enqueues and runs
    (``pip install 'dtq[otel]'``; see :mod:`dtq.contrib.otel`).
    """

    def __init__(
        self, settings: Settings | None = None, *, tracing: bool | None = None, **overrides: Any
    ) -> None:
        self._settings = settings
        self._overrides = overrides
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._client: Client | None = None
        self._aclients: dict[int, AsyncClient] = {}
        self._tracing = tracing
        self.middleware: list[object] = []
        self._hooks: Hooks | None = None
        self._hooks_ready = False
        # True once hooks() found no before_enqueue: a client's enqueue then tests this flag
        # alone (no call); add_middleware and configure clear it.
        self.no_enqueue_hooks = False

    def add_middleware(self, middleware: object) -> None:
        """Add a middleware: an object with any of ``before_enqueue``, ``around_task``,
        ``on_outcome`` (see :mod:`dtq.middleware`). The first added is the outermost. Add it
        before the worker starts (the worker reads the list once)."""
        check_middleware(middleware)
        self.middleware.append(middleware)
        self._hooks_ready = self.no_enqueue_hooks = False

    def hooks(self) -> Hooks | None:
        """The middleware's hooks (with tracing's first when enabled), or None when none."""
        if not self._hooks_ready:
            mws = list(self.middleware)
            tracing = self._tracing if self._tracing is not None else self.settings.tracing
            if tracing:
                from dtq.contrib.otel import OpenTelemetryMiddleware

                if not any(isinstance(m, OpenTelemetryMiddleware) for m in mws):
                    mws.insert(0, OpenTelemetryMiddleware())
            self._hooks = Hooks.of(mws)
            self._hooks_ready = True
            self.no_enqueue_hooks = self._hooks is None or not self._hooks.before_enqueue
        return self._hooks

    @property
    def settings(self) -> Settings:
        # Resolved lazily so importing a tasks module never fails on the environment.
        if self._settings is None:
            self._settings = load_settings(**self._overrides)
        return self._settings

    def configure(self, settings: Settings) -> None:
        """Replace the settings (the worker does this with its command-line flags)."""
        self._settings = settings
        self._client = None
        self._aclients.clear()
        self._hooks_ready = self.no_enqueue_hooks = False  # DTQ_TRACING may differ

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = DEFAULT_PRIORITY,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float | None = None,
        limit: Limit | None = None,
        unique: bool = False,
        expires: float | timedelta | None = None,
    ) -> _Register: ...

    def task(  # type: ignore[misc]
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = DEFAULT_PRIORITY,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float | None = None,
        limit: Limit | None = None,
        unique: bool = False,
        expires: float | timedelta | None = None,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function (sync or async) as a task. Name defaults to module.function.

        ``limit`` (a :class:`dtq.Limit`) caps runs and starts per key across all workers.
        ``max_retries``, ``timeout`` and ``expires`` (seconds after the enqueue by which a run
        must start) govern the task however it is enqueued, by name from any client too: the
        worker publishes them and the claim applies them where the enqueue gave no value.
        ``unique=True``: while a task of this name with the same arguments is queued, scheduled
        or running, enqueueing it again returns that task (see docs/lifecycle.md).
        """
        check_queue_name(queue)
        if type(priority) is not int or not 0 <= priority <= 9:
            raise InvalidRequest("priority must be an integer from 0 to 9")
        if type(max_retries) is not int or max_retries < 0:
            raise InvalidRequest("max_retries must be a non-negative integer")
        if isinstance(expires, timedelta):
            expires = expires.total_seconds()
        for opt, v in (("timeout", timeout), ("expires", expires)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
                raise InvalidRequest(f"{opt} must be a positive number of seconds")

        def register(f: Callable[P, R]) -> Task[P, R]:
            tname = name or f"{f.__module__}.{f.__qualname__}"
            check_task_name(tname)
            if tname in self.tasks:
                raise InvalidRequest(f"task {tname!r} is registered twice")
            d = TaskDefaults(queue, priority, max_retries, timeout, limit, unique, expires)
            t: Task[P, R] = Task(self, f, tname, d)
            self.tasks[tname] = t
            return t

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        name: str | None = None,
        queue: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        overlap: bool = True,
        grace: float = 60.0,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        expires: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        group: str | None = None,
    ) -> Callable[[Any], Task[Any, Any]]:
        """Declare a periodic schedule (``cron=`` in ``tz``, or ``every=`` seconds) for a task.

        Decorates a function (registering it as a task) or a :class:`Task`. The schedule's name
        defaults to the task's name. See :mod:`dtq.schedules` for the rules (grace period,
        overlap, DST).
        """
        from dtq.schedules.model import Schedule, declare

        if isinstance(every, timedelta):
            every = every.total_seconds()

        def decorate(fn: Any) -> Task[Any, Any]:
            task: Task[Any, Any] = (
                fn if isinstance(fn, Task) else self.task(queue=queue or "default")(fn)
            )
            declare(
                self,
                Schedule(
                    name=name or task.name,
                    task=task.name,
                    queue=queue or task.defaults.queue,
                    cron=cron,
                    every=every,
                    tz=tz,
                    args=list(args),
                    kwargs=dict(kwargs or {}),
                    overlap=overlap,
                    grace=grace,
                    priority=priority,
                    max_retries=max_retries,
                    timeout=timeout,
                    expires=expires,
                    metadata=dict(metadata or {}),
                    source="code",
                    group=group,
                ),
            )
            return task

        return decorate

    def defaults_for(self, name: str) -> TaskDefaults | None:
        t = self.tasks.get(name)
        return t.defaults if t else None

    def client(self) -> Client:
        """A blocking client bound to this app (created once)."""
        from dtq.sdk.client import Client

        if self._client is None:
            self._client = Client(app=self)
        return self._client

    def async_client(self) -> AsyncClient:
        """An asyncio client bound to this app, one per event loop."""
        from dtq.sdk.client import AsyncClient

        loop = id(asyncio.get_running_loop())
        if loop not in self._aclients:
            self._aclients[loop] = AsyncClient(app=self)
        return self._aclients[loop]


def load_app(spec: str) -> App:
    """The :class:`dtq.App` that ``spec`` names: ``module:attribute``, a file's path in place of
    the module (``tasks.py:app``, ``src/proj/tasks.py:app``), or the module or path alone when
    it holds exactly one App (else the error names the Apps it holds)."""
    module_name, sep, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not module_name or (sep and not attr):
        raise ConfigError(f"APP must be 'module:attribute' (or a file's path), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if module_name.endswith(".py") or os.sep in module_name:
        module_name = _module_of_path(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        where = _where(exc)
        raise ConfigError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
            + (f" (at {where})" if where else "")
        ) from None
    apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
    if not attr:
        if len(apps) == 1:
            return getattr(module, apps[0])  # type: ignore[no-any-return]
        found = f"it holds {', '.join(apps)}" if apps else "it holds none"
        raise ConfigError(f"APP {spec!r} names no dtq.App: give 'module:attribute' ({found})")
    if not hasattr(module, attr):
        hint = f"; dtq.App objects in it: {', '.join(apps)}" if apps else ""
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}{hint}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not a dtq.App (found {type(app).__name__})")
    return app


def _module_of_path(path: str) -> str:
    """The module name of a ``.py`` file's path: dotted from the working directory when every
    folder on the way is a package (relative imports keep working), else its bare name, with
    its folder put on ``sys.path``."""
    file = os.path.abspath(path if path.endswith(".py") else path + ".py")
    if not os.path.isfile(file):
        raise ConfigError(f"APP: no file {path!r}")
    rel = os.path.relpath(file, os.getcwd())
    parts = rel[:-3].split(os.sep)
    here = os.getcwd()
    if not rel.startswith(".."):
        dirs = [os.path.join(here, *parts[:i]) for i in range(1, len(parts))]
        if all(os.path.isfile(os.path.join(d, "__init__.py")) for d in dirs):
            return ".".join(parts)
    folder = os.path.dirname(file)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return os.path.basename(file)[:-3]


def _where(exc: BaseException) -> str | None:
    """``file:line`` where an import failed in the user's code (not in importlib or dtq)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    found = None
    skip = os.path.dirname(importlib.__file__)
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(("<", skip)) and filename != __file__:
            found = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found
