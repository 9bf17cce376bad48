"""JSON encoding of arguments and results, with the size limits applied."""

from __future__ import annotations

import json
from typing import Any

from dtq.errors import PayloadTooLarge, SerializationError

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any, what: str) -> str:
    """Encode ``value`` as compact JSON or raise SerializationError saying what was refused."""
    try:
        text = _encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"{what} must be JSON-serializable: {exc}") from None
    if not text.isascii():  # (one C scan) it must also be sendable: a lone surrogate is not
        utf8(text, what)
    return text


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
    # Characters count at most 4 bytes each in UTF-8: encode only when that could matter.
    size = len(a) + len(k)
    if size * 4 > limit:
        size = len(a.encode()) + len(k.encode())
    if size > limit:
        raise PayloadTooLarge(
            f"encoded arguments are {size} bytes, over DTQ_MAX_PAYLOAD_BYTES={limit}"
        )
    return a, k
