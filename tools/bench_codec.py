"""Micro-benchmark of argument encoding (no Redis), for the choice of dtq.codec's encoder:

    .venv/bin/python tools/bench_codec.py          # orjson is measured when installed

Per call, best of 7 rounds: the stdlib ``json.JSONEncoder`` path dtq used before (its exact
options, plus the UTF-8 check), msgspec and orjson on a typical small args list, the same with a
datetime and a UUID, and ``codec.encode_args`` (what an enqueue calls) as it is now.
"""

from __future__ import annotations

import json
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import msgspec

from dtq import codec

PLAIN: list[Any] = ["user@example.com", 42, {"subject": "hi", "retry": True, "tags": ["a"]}, 3.5]
WITH_NONE: list[Any] = ["user@example.com", None, {"subject": "hi", "cc": None}, 3.5]
TYPED: list[Any] = [datetime.now(UTC), uuid.uuid4(), Decimal("12.30"), b"\x00\x01"]

_stdlib = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def stdlib_dumps(value: Any) -> str:  # dtq.codec.dumps before msgspec
    text = _stdlib.encode(value)
    if not text.isascii():
        text.encode()
    return text


def _orjson() -> Callable[[Any], str] | None:
    try:
        import orjson
    except ImportError:
        return None

    def default(o: Any) -> Any:
        if isinstance(o, Decimal):
            return str(o)
        if isinstance(o, bytes):
            return msgspec.to_builtins(o)
        raise TypeError

    return lambda v: orjson.dumps(v, default=default).decode()


def best_ns(fn: Callable[[], object], n: int = 100_000) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e9


def main() -> None:
    enc = msgspec.json.Encoder()
    oj = _orjson()
    rows: list[tuple[str, Callable[[], object]]] = [
        ("stdlib json (before), plain args", lambda: stdlib_dumps(PLAIN)),
        ("msgspec, plain args", lambda: enc.encode(PLAIN).decode()),
        ("codec.dumps (now), plain args", lambda: codec.dumps(PLAIN, "args")),
        ("codec.encode_args (now), plain args", lambda: codec.encode_args(PLAIN, None, 1 << 20)),
        ("stdlib json (before), args holding None", lambda: stdlib_dumps(WITH_NONE)),
        (
            "codec.encode_args (now), args holding None",
            lambda: codec.encode_args(WITH_NONE, None, 1 << 20),
        ),
        ("msgspec, datetime/UUID/Decimal/bytes", lambda: enc.encode(TYPED).decode()),
        ("codec.dumps (now), typed args", lambda: codec.dumps(TYPED, "args")),
    ]
    if oj is not None:
        rows[2:2] = [("orjson, plain args", lambda: oj(PLAIN))]
        rows.append(("orjson (+default), typed args", lambda: oj(TYPED)))
    for name, fn in rows:
        print(f"{name:42s} {best_ns(fn):7.0f} ns")


if __name__ == "__main__":
    main()
