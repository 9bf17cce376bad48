"""``dtq.App``: the registry of task functions a worker runs and a client enqueues."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from dtq.errors import ConfigError, InvalidRequest
from dtq.limits import Limit
from dtq.models import TaskHandle
from dtq.requests import DEFAULT_MAX_RETRIES, DEFAULT_PRIORITY, TaskDefaults, check_task_name
from dtq.settings import QUEUE_NAME_RE, Settings, load_settings
from dtq.workflows import Sig

if TYPE_CHECKING:
    from dtq.client import AsyncClient, Client

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-call options for :meth:`Task.enqueue_with`."""

    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    eta: datetime | str | None = None
    max_retries: int | None = None
    timeout: float | None = None
    idempotency_key: str | None = None
    expires: float | timedelta | datetime | None = None
    metadata: Mapping[str, Any] | None = None
    unique: bool | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(eq=False)
class Task(Generic[P, R]):
    """A registered task. Call it to run it inline; ``enqueue`` to send it to a worker."""

    app: App
    fn: Callable[P, R] | Callable[P, Awaitable[R]]
    name: str
    defaults: TaskDefaults
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.fn(*args, **kwargs)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Sig:
        """A workflow step of this task: type-checked like :meth:`enqueue`, with the task's own
        defaults. A step that gets an earlier result (in a chain, a chord's callback) is given
        its other arguments: use ``dtq.sig(task.name, ...)`` for those (docs/workflows.md)."""
        return Sig(self.name, tuple(args), dict(kwargs) or None, {}, self.defaults)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Enqueue with the task's own defaults (type-checked arguments). Blocking."""
        return self.app.client().enqueue(self.name, list(args), kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Enqueue with the task's own defaults (type-checked arguments), from asyncio."""
        return await self.app.async_client().enqueue(self.name, list(args), kwargs)

    def enqueue_with(
        self, options: EnqueueOptions, *args: P.args, **kwargs: P.kwargs
    ) -> TaskHandle:
        """Enqueue with per-call options (delay, priority, idempotency key, ...)."""
        return self.app.client().enqueue(self.name, list(args), kwargs, **options.as_kwargs())

    async def aenqueue_with(
        self, options: EnqueueOptions, *args: P.args, **kwargs: P.kwargs
    ) -> TaskHandle:
        return await self.app.async_client().enqueue(
            self.name, list(args), kwargs, **options.as_kwargs()
        )


class App:
    """Holds settings and the task registry. Settings come from the environment unless given."""

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        self._settings = settings
        self._overrides = overrides
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._client: Client | None = None
        self._aclients: dict[int, AsyncClient] = {}

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
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

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
        if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
            raise InvalidRequest(f"bad queue name {queue!r}")
        if not 0 <= priority <= 9:
            raise InvalidRequest("priority must be an integer from 0 to 9")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidRequest("max_retries must be a non-negative integer")
        if timeout is not None and timeout <= 0:
            raise InvalidRequest("timeout must be positive")
        if isinstance(expires, timedelta):
            expires = expires.total_seconds()
        if expires is not None and not expires > 0:
            raise InvalidRequest("expires must be a positive number of seconds")

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
    ) -> Callable[[Any], Task[Any, Any]]:
        """Declare a periodic schedule (``cron=`` in ``tz``, or ``every=`` seconds) for a task.

        Decorates a function (registering it as a task) or a :class:`Task`. See
        :mod:`dtq.schedules` for the rules (grace period, overlap, DST).
        """
        from dtq.schedules import periodic

        return periodic(
            self, cron=cron, every=every, tz=tz, name=name, queue=queue, args=args,
            kwargs=kwargs, overlap=overlap, grace=grace, priority=priority,
            max_retries=max_retries, timeout=timeout, expires=expires,
        )  # fmt: skip

    def defaults_for(self, name: str) -> TaskDefaults | None:
        t = self.tasks.get(name)
        return t.defaults if t else None

    def client(self) -> Client:
        """A blocking client bound to this app (created once)."""
        from dtq.client import Client

        if self._client is None:
            self._client = Client(app=self)
        return self._client

    def async_client(self) -> AsyncClient:
        """An asyncio client bound to this app, one per event loop."""
        from dtq.client import AsyncClient

        loop = id(asyncio.get_running_loop())
        if loop not in self._aclients:
            self._aclients[loop] = AsyncClient(app=self)
        return self._aclients[loop]


def load_app(spec: str) -> App:
    """Import ``module:attribute`` naming a :class:`dtq.App`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"APP must be 'module:attribute', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not a dtq.App (found {type(app).__name__})")
    return app
