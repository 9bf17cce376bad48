"""Middleware: code of yours around every enqueue and every run (``app.add_middleware``).

A middleware is any object with one or more of ``before_enqueue(request)``, ``async
around_task(ctx, call_next)`` and ``on_outcome(ctx, outcome)``; subclass :class:`Middleware` for
the signatures. The first added is the outermost. The rules: docs/integrations/middleware.md.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtq.errors import ConfigError, DtqError

if TYPE_CHECKING:
    from dtq.context import TaskContext

log = logging.getLogger("dtq.middleware")

HOOK_NAMES = ("before_enqueue", "around_task", "on_outcome")


@dataclass(slots=True)
class EnqueueRequest:
    """One task a client is about to enqueue, as ``before_enqueue`` sees (and may amend) it."""

    name: str
    args: Any
    kwargs: Mapping[str, Any] | None
    queue: str
    """The queue it goes to (the one asked for, else the task's declared queue)."""
    options: dict[str, Any]
    """The other enqueue options given (priority, delay, ...), by keyword; unset ones absent."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Stored with the task and shown by ``get()``, ``dtq task`` and the API (JSON)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Carried to the worker for middleware (``ctx.headers``), e.g. a W3C ``traceparent``.
    Not shown to users; strings only, at most 4096 bytes encoded."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What became of one run, as ``on_outcome`` sees it."""

    verdict: str
    """``succeeded``, ``retried``, ``failed``, ``cancelled`` (stored by the fence); ``stale``
    (the fence refused it: a newer run owns the task); ``lost`` (nothing written: the claim
    was lost, Redis stayed away or the write failed; the task is reclaimed later);
    ``interrupted`` (the worker shut down and handed the task back to its queue)."""
    duration: float
    """Seconds from the run's start to its verdict."""
    error: str | None = None
    """The error text stored with a failed or retried run."""
    exception: BaseException | None = None
    """What the body (or an ``around_task``) raised, with its traceback; None on success."""
    result: Any = None
    """The body's result when it returned."""


class Middleware:
    """Base class of a middleware: override any of the hooks (see :mod:`dtq.middleware`)."""

    def before_enqueue(self, request: EnqueueRequest) -> Awaitable[None] | None:
        return None

    async def around_task(self, ctx: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        return await call_next()

    def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> Awaitable[None] | None:
        return None


def _own_hook(obj: object, name: str) -> Callable[..., Any] | None:
    """``obj``'s hook ``name``, or None when it has none or keeps the base class's no-op."""
    fn = getattr(obj, name, None)
    if fn is None:
        return None
    if isinstance(obj, Middleware) and getattr(type(obj), name, None) is getattr(Middleware, name):
        return None
    if not callable(fn):
        raise ConfigError(f"middleware {obj!r}: {name} is not callable")
    return fn  # type: ignore[no-any-return]


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    )


@dataclass(frozen=True, slots=True)
class Hooks:
    """An app's middleware, sorted by hook: what clients and the worker call."""

    before_enqueue: tuple[tuple[Callable[[EnqueueRequest], Any], bool], ...] = ()
    around_task: tuple[Callable[[TaskContext, Callable[[], Awaitable[Any]]], Any], ...] = ()
    on_outcome: tuple[tuple[Callable[[TaskContext, RunOutcome], Any], bool], ...] = ()

    @classmethod
    def of(cls, middleware: list[object]) -> Hooks | None:
        """The hooks of ``middleware`` in order, or None when there are none (the fast path)."""
        before, around, after = [], [], []
        for mw in middleware:
            if (fn := _own_hook(mw, "before_enqueue")) is not None:
                before.append((fn, _is_async(fn)))
            if (fn := _own_hook(mw, "around_task")) is not None:
                around.append(fn)
            if (fn := _own_hook(mw, "on_outcome")) is not None:
                after.append((fn, _is_async(fn)))
        if not (before or around or after):
            return None
        return cls(tuple(before), tuple(around), tuple(after))


def check_middleware(obj: object) -> None:
    """Refuse an object that has none of the hooks, or a sync ``around_task``."""
    if isinstance(obj, type):
        raise ConfigError(f"add_middleware wants an instance, got the class {obj.__name__}")
    found = [n for n in HOOK_NAMES if getattr(obj, n, None) is not None]
    if not found:
        raise ConfigError(f"{obj!r} has none of {', '.join(HOOK_NAMES)}: it is not a middleware")
    around = _own_hook(obj, "around_task")
    if around is not None and not _is_async(around):
        raise ConfigError(
            f"{type(obj).__name__}.around_task must be 'async def' (it awaits call_next(), "
            "which runs on the worker's event loop for sync tasks too)"
        )


def before_enqueue_sync(hooks: Hooks, request: EnqueueRequest) -> None:
    """Run the ``before_enqueue`` hooks for the blocking client."""
    for fn, is_async in hooks.before_enqueue:
        if is_async:
            raise DtqError(
                f"before_enqueue {fn!r} is async: the blocking Client cannot await it "
                "(use AsyncClient, or make the hook a plain function)"
            )
        res = fn(request)
        if inspect.isawaitable(res):
            if inspect.iscoroutine(res):
                res.close()
            raise DtqError(f"before_enqueue {fn!r} returned an awaitable to the blocking Client")


async def before_enqueue_async(hooks: Hooks, request: EnqueueRequest) -> None:
    """Run the ``before_enqueue`` hooks for the asyncio client (sync ones are called)."""
    for fn, _ in hooks.before_enqueue:
        res = fn(request)
        if inspect.isawaitable(res):
            await res


async def around(hooks: Hooks, ctx: TaskContext, body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body`` inside every ``around_task`` hook, the first one outermost."""
    chain = hooks.around_task
    last = len(chain)

    def step(i: int) -> Awaitable[Any]:
        if i == last:
            return body()
        return chain[i](ctx, lambda: step(i + 1))  # type: ignore[no-any-return]

    return await step(0)


async def notify_outcome(hooks: Hooks, ctx: TaskContext, outcome: RunOutcome) -> None:
    """Call every ``on_outcome`` hook; one that raises is logged and the others still run."""
    for fn, _ in hooks.on_outcome:
        try:
            res = fn(ctx, outcome)
            if inspect.isawaitable(res):
                await res
        except Exception:
            log.exception(
                "on_outcome hook %r failed for %s attempt %d (the outcome %s stands)",
                fn,
                ctx.id,
                ctx.attempt,
                outcome.verdict,
            )
