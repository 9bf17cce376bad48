"""``dtq.Task``: a registered task function, its declared defaults and its call's options.

It reaches its app's client through the App it holds (it does not import dtq.app).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, Unpack

from dtq import codec
from dtq.errors import InvalidRequest
from dtq.models import TaskHandle
from dtq.sdk.requests import ENQUEUE_OPTIONS, EnqueueOptions, TaskDefaults
from dtq.workflows import Sig

if TYPE_CHECKING:
    from dtq.app import App

P = ParamSpec("P")
R = TypeVar("R")
P2 = ParamSpec("P2")
R2 = TypeVar("R2")


@dataclass(eq=False)
class Task(Generic[P, R]):
    """A registered task. Call it to run it inline; ``enqueue`` to send it to a worker."""

    app: App
    fn: Callable[P, R] | Callable[P, Awaitable[R]]
    name: str
    defaults: TaskDefaults
    call_options: EnqueueOptions | None = None
    """Options bound by :meth:`options` (None: the task's own defaults alone)."""
    is_async: bool = field(init=False)
    arg_types: codec.ArgTypes | codec.Unresolved | None = field(init=False, repr=False)
    """Its typed parameters, converted by the worker before each call (docs/arguments.md);
    None when all are plain JSON types: then a call converts nothing."""

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.arg_types = codec.arg_types(self.fn)
        functools.update_wrapper(self, self.fn)  # type: ignore[arg-type]
        try:
            self._signature: inspect.Signature | None = inspect.signature(self.fn)
        except (TypeError, ValueError):  # no signature to check (a builtin)
            self._signature = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.fn(*args, **kwargs)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Sig:
        """A workflow step of this task: type-checked like :meth:`enqueue`, with the task's own
        defaults, all its arguments given. A step that gets an earlier result (in a chain, a
        chord's callback) is written with :meth:`taking_result` (docs/workflows.md)."""
        return Sig(self.name, tuple(args), dict(kwargs) or None, {}, self.defaults)

    def taking_result(
        self: Task[Concatenate[Any, P2], R2], *args: P2.args, **kwargs: P2.kwargs
    ) -> Sig:
        """A *partial* workflow step of this task: the flow fills its first argument with the
        earlier result (a chain's previous step, a chord's list of results); ``args`` and
        ``kwargs`` are the others, type-checked against the rest of the task's signature
        (``chain(add.s(1, 2), mul.taking_result(10))`` runs ``mul(3, 10)``). Checked at once
        too: the task must take a first positional argument, and the others must fit."""
        if self._signature is not None:  # (none for a builtin)
            first = next(iter(self._signature.parameters.values()), None)
            if first is None or first.kind in (first.KEYWORD_ONLY, first.VAR_KEYWORD):
                raise InvalidRequest(
                    f"task {self.name!r} takes no first positional argument for the flow to fill"
                )
            try:
                self._signature.bind(None, *args, **kwargs)
            except TypeError as exc:
                raise InvalidRequest(
                    f"task {self.name!r}: {exc} (the flow gives the first)"
                ) from None
        return Sig(self.name, tuple(args), dict(kwargs) or None, {}, self.defaults)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Enqueue with the task's own defaults (type-checked arguments). Blocking.

        Sent through the app's own client (``app.client()``: the App's settings, i.e. the
        ``DTQ_*`` environment unless the App was given settings). To send through a
        :class:`dtq.Client` you built, use ``client.enqueue(task, ...)`` (same typing).
        """
        return self.app.client().enqueue(self, *args, **kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Enqueue with the task's own defaults (type-checked arguments), from asyncio, through
        the app's own client (see :meth:`enqueue`)."""
        return await self.app.async_client().enqueue(self, *args, **kwargs)

    def options(self, **options: Unpack[EnqueueOptions]) -> Task[P, R]:
        """This task with per-call enqueue options (any of :class:`EnqueueOptions`), for
        ``client.enqueue(task.options(delay=5), ...)`` or ``task.options(delay=5).enqueue(...)``;
        the registered task is unchanged. An unknown option raises ``TypeError``."""
        unknown = options.keys() - ENQUEUE_OPTIONS
        if unknown:
            raise TypeError(f"options() got unexpected keyword(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, call_options=options)

    def decode_result(self, value: Any) -> R:
        """A stored result (as JSON decoding gave it) as the task's return type: a ``-> datetime``
        task's ISO string as a datetime. Unchanged when that type is a plain JSON one."""
        tp = codec.return_type(self.fn)
        if tp is None or value is None:
            return value  # type: ignore[no-any-return]
        return codec.convert(value, tp)  # type: ignore[no-any-return]

    def request(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The enqueue fields of a call of this task; ``TypeError`` (before anything is stored)
        when the arguments cannot bind to the function's signature."""
        if self._signature is not None:
            try:
                self._signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"task {self.name!r}: {exc}") from None
        fields: dict[str, Any] = {"name": self.name, "args": list(args), "kwargs": kwargs}
        if self.call_options is not None:
            fields.update((k, v) for k, v in self.call_options.items() if v is not None)
        return fields
