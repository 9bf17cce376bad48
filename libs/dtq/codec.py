"""JSON encoding of arguments and results, with the size limits applied; and their decoding to
the types a task function's annotations name (docs/arguments.md).

The wire stays plain JSON, what other languages and the HTTP API see: a datetime is an ISO 8601
string, a date ``YYYY-MM-DD``, a UUID its canonical text, a Decimal its text (no float rounding),
bytes base64, an enum its value, a dataclass or a pydantic model an object of its fields.

The encoder is msgspec's (docs/performance.md, "Hand-written code"): it also decodes by type
annotation, so one dependency does both.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import re
import types
import typing
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect
from pydantic import BaseModel

from dtq.errors import PayloadTooLarge, SerializationError


def _enc_hook(obj: Any) -> Any:
    """What msgspec does not encode itself: pydantic models (as their JSON mode dump)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")  # (as stdlib)


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)


# Says why a value holding ``null`` was refused: msgspec writes NaN and infinities as null.
_strict = json.JSONEncoder(
    ensure_ascii=False,
    separators=(",", ":"),
    allow_nan=False,
    default=lambda obj: msgspec.to_builtins(obj, enc_hook=_enc_hook),
)


MAX_DEPTH = 64
"""Deepest nesting of arrays and objects in one encoded value (the args list is a level): far
past any real data's, well below what readers take back (pydantic's JSON parser stops at 200)."""
UNDECODABLE = f"nested deeper than {MAX_DEPTH} levels"
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(raw: bytes | str) -> bool:
    """Whether JSON text ``raw`` nests arrays and objects deeper than :data:`MAX_DEPTH`."""
    if isinstance(raw, str):
        if raw.count("[") + raw.count("{") <= MAX_DEPTH:
            return False
        data = raw.encode(errors="surrogatepass")
    elif raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    else:
        data = raw
    steps = _JSON_STRING.sub(b"", data).translate(_BRACKET_STEP, _NOT_BRACKET)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0) > MAX_DEPTH


def loads_stored(raw: str) -> Any:
    """A stored JSON value for a reader (a listing, ``get``, the CLI): one nested past
    :data:`MAX_DEPTH` (written by a raw script or an older version) is shown as
    ``{"undecodable": "nested deeper than 64 levels"}`` rather than failing the whole answer."""
    if too_deep(raw):
        return {"undecodable": UNDECODABLE}
    try:
        return json.loads(raw)
    except RecursionError:
        return {"undecodable": UNDECODABLE}


def dumps(value: Any, what: str) -> str:
    """Encode ``value`` as compact JSON or raise SerializationError saying what was refused
    (not JSON, not Unicode, or nested deeper than :data:`MAX_DEPTH`)."""
    deep = SerializationError(
        f"{what} nested deeper than {MAX_DEPTH} levels (arrays and objects inside one another)"
    )
    try:
        raw = _encoder.encode(value)
    except UnicodeEncodeError as exc:  # a lone surrogate such as "\ud800"
        raise SerializationError(f"{what} is not valid Unicode text: {exc.reason}") from None
    except RecursionError:
        raise deep from None
    except _ENCODE_ERRORS as exc:
        raise SerializationError(f"{what} must be JSON-serializable: {exc}") from None
    if too_deep(raw):
        raise deep
    if b"null" in raw and not _finite(value):  # a None, or a NaN/infinity written as null
        try:
            _strict.encode(value)  # says which, in the stdlib's words
        except _ENCODE_ERRORS as exc:
            raise SerializationError(f"{what} must be JSON-serializable: {exc}") from None
    return raw.decode()


_SCALARS = frozenset({str, int, bool, type(None)})


def _finite(value: Any) -> bool:
    """False when ``value`` may hold a NaN or an infinity: walks lists, tuples and dicts of plain
    values; anything else is left to the stdlib re-encode."""
    t = type(value)
    if t in _SCALARS:
        return True
    if t is float:
        return math.isfinite(value)
    if t is dict:
        value = value.values()
    elif t is not list and t is not tuple:
        return False
    for v in value:  # noqa: SIM110 (a generator costs more)
        if type(v) not in _SCALARS and not _finite(v):
            return False
    return True


def utf8(text: str, what: str) -> None:
    """Raise SerializationError unless ``text`` encodes as UTF-8 (a lone surrogate such as
    "\\ud800" does not); found at validation, not half-way through sending a batch."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise SerializationError(f"{what} is not valid Unicode text: {exc.reason}") from None


def encode_args(args: Any, kwargs: Any, limit: int) -> tuple[str, str]:
    if not args and kwargs is None and (args is None or type(args) in (list, tuple)):
        return "[]", ""  # the no-argument task: nothing to encode
    if args is None:
        args = []
    if isinstance(args, tuple):
        args = list(args)
    if not isinstance(args, list):
        raise SerializationError(f"args must be a list or tuple, not {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise SerializationError(f"kwargs must be a dict, not {type(kwargs).__name__}")
    a = dumps(args, "args")
    k = dumps(kwargs, "kwargs") if kwargs else ""
    # At most 4 bytes a character: encode only when that could pass the limit.
    size = len(a) + len(k)
    if size * 4 > limit:
        size = len(a.encode()) + len(k.encode())
    if size > limit:
        raise PayloadTooLarge(
            f"encoded arguments are {size} bytes, over DTQ_MAX_PAYLOAD_BYTES={limit}"
        )
    return a, k


# --- decoding by type annotation -------------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None), list, dict, object)


def is_plain(tp: Any) -> bool:
    """True when JSON decoding alone already gives a value of type ``tp`` (str, int, float, bool,
    None, list/dict of those, Any, unions of those): such a value needs no conversion."""
    if tp is Any or tp is None or tp in _PLAIN or isinstance(tp, typing.TypeVar):
        return True
    origin = typing.get_origin(tp)
    if origin in (list, dict, typing.Union, types.UnionType):
        return all(is_plain(a) for a in typing.get_args(tp))
    return False


def convertible(tp: Any) -> bool:
    """True when :func:`convert` can make a ``tp`` from JSON: every type inside it is one msgspec
    knows or a pydantic model. A parameter of any other class (a ``Callable``, a class of the
    user's own) is handed what JSON decoding gave."""
    try:
        info = msgspec.inspect.type_info(tp)
    except Exception:  # whatever the annotation is, registering the task must not fail
        return False
    seen: set[int] = set()
    todo: list[Any] = [info]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, msgspec.inspect.CustomType):
            if not (isinstance(t.cls, type) and issubclass(t.cls, BaseModel)):
                return False
            continue
        for name in getattr(t, "__struct_fields__", ()):
            v = getattr(t, name)
            for x in v if isinstance(v, tuple) else (v,):
                if isinstance(x, msgspec.inspect.Field):
                    x = x.type
                if isinstance(x, msgspec.inspect.Type):
                    todo.append(x)
    return True


def _dec_hook(tp: Any, obj: Any) -> Any:
    """What msgspec does not decode itself: pydantic models (validated from their JSON form)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.model_validate(obj)
    raise NotImplementedError(f"type {tp!r} is not supported")


def convert(value: Any, tp: Any) -> Any:
    """``value`` (as JSON decoding gave it) converted to type ``tp``; ValueError when it is not
    one (msgspec.ValidationError and pydantic's ValidationError are ValueErrors)."""
    return msgspec.convert(value, tp, dec_hook=_dec_hook)


class ArgTypes:
    """The typed parameters of one task function: what the worker converts before a call.

    Made once when the task is registered (:func:`arg_types`); a task whose parameters are all
    plain JSON types has none, and its calls convert nothing.
    """

    __slots__ = ("by_name", "n_positional", "positional", "var_keyword", "var_positional")

    def __init__(self, params: list[inspect.Parameter], hints: dict[str, Any]) -> None:
        self.positional: list[tuple[int, str, Any]] = []
        self.by_name: dict[str, Any] = {}
        self.var_positional: Any = None
        self.var_keyword: Any = None
        self.n_positional = 0
        for p in params:
            tp = hints.get(p.name, Any)
            typed = not is_plain(tp) and convertible(tp)
            if p.kind is p.VAR_POSITIONAL:
                self.var_positional = tp if typed else None
            elif p.kind is p.VAR_KEYWORD:
                self.var_keyword = tp if typed else None
            else:
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    if typed:
                        self.positional.append((self.n_positional, p.name, tp))
                    self.n_positional += 1
                if typed and p.kind is not p.POSITIONAL_ONLY:
                    self.by_name[p.name] = tp

    @property
    def empty(self) -> bool:
        return not (self.positional or self.by_name or self.var_positional or self.var_keyword)

    def decode(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` with each typed argument converted to its parameter's type.
        Raises ValueError naming the argument when one cannot be."""
        n = len(args)
        if self.positional or self.var_positional is not None:
            args = list(args)
            for i, name, tp in self.positional:
                if i < n:
                    args[i] = _one(args[i], tp, name)
            if self.var_positional is not None:
                for i in range(self.n_positional, n):
                    args[i] = _one(args[i], self.var_positional, f"*args[{i - self.n_positional}]")
        if kwargs and (self.by_name or self.var_keyword is not None):
            kwargs = {
                k: v if (tp := self.by_name.get(k, self.var_keyword)) is None else _one(v, tp, k)
                for k, v in kwargs.items()
            }
        return args, kwargs


class Unresolved:
    """Stands for the ArgTypes of a function whose annotations could not be resolved when it
    was registered (a name defined after it): resolved at its first call instead."""

    __slots__ = ("fn", "types")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.types: ArgTypes | None = None

    def decode(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        if self.types is None:  # (plain, or still unresolvable: as given)
            found = arg_types(self.fn)
            self.types = found if isinstance(found, ArgTypes) else ArgTypes([], {})
        return self.types.decode(args, kwargs)


_made: weakref.WeakKeyDictionary[Callable[..., Any], ArgTypes | Unresolved | None] = (
    weakref.WeakKeyDictionary()
)


def arg_types(fn: Callable[..., Any]) -> ArgTypes | Unresolved | None:
    """The typed parameters of ``fn``, or None when every one is a plain JSON type; worked out
    once per function (``task.options(...)`` copies a task per call: not again for each)."""
    try:
        return _made[fn]
    except (KeyError, TypeError):  # not made yet, or not weakly referable (then not kept)
        pass
    found = _arg_types(fn)
    if not isinstance(found, Unresolved):
        with contextlib.suppress(TypeError):
            _made[fn] = found
    return found


def _arg_types(fn: Callable[..., Any]) -> ArgTypes | Unresolved | None:
    try:
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters.values())
    except Exception:  # a forward reference not defined yet, a name under TYPE_CHECKING, ...
        return Unresolved(fn)
    found = ArgTypes(params, hints)
    return None if found.empty else found


def return_type(fn: Callable[..., Any]) -> Any:
    """The type ``fn``'s result is decoded to: its return annotation, or None when that is
    absent, unresolvable or a plain JSON type (nothing to convert)."""
    try:
        tp = typing.get_type_hints(fn).get("return")
    except Exception:
        return None
    if tp is None or is_plain(tp) or not convertible(tp):
        return None
    return tp


def _one(value: Any, tp: Any, name: str) -> Any:
    try:
        return convert(value, tp)
    except (ValueError, TypeError, NotImplementedError) as exc:
        what = tp.__name__ if isinstance(tp, type) else repr(tp)
        raise ValueError(f"argument {name!r} cannot be read as {what}: {exc}") from None
