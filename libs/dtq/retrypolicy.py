"""How the end of a run becomes its outcome, for the worker's executor and
:class:`dtq.testing.TestQueue` alike: the retry delay (exponential backoff, capped, with
jitter) and the mapping of a result or an exception to the record the scripts write. Pure: no
I/O, so the SDK's test queue runs the worker's own rules without importing the worker."""

from __future__ import annotations

import random
import traceback

from dtq import codec
from dtq import scripts as sc
from dtq.errors import Fail, Retry, SerializationError
from dtq.models import clip_traceback
from dtq.settings import Settings

NO_RETRY = None
"""A failure's retry delay that forbids a retry (``Fail``, an unstorable result)."""


class TaskTimeout(Exception):
    """The run passed its task's timeout (retried like any error, without a traceback)."""


def retry_delay_ms(s: Settings, retries_so_far: int, asked: float | None = None) -> int:
    """Exponential backoff with jitter: base * 2**n, capped, times a factor in [0.5, 1.5)."""
    if asked is not None:
        return max(0, int(asked * 1000))
    delay = min(s.retry_backoff_max_s, s.retry_backoff_s * (2**retries_so_far))
    return int(min(s.retry_backoff_max_s, delay * random.uniform(0.5, 1.5)) * 1000)


def traceback_text(exc: BaseException) -> str:
    """The failure's traceback for its task record (failure path only), bounded in size."""
    return clip_traceback("".join(traceback.format_exception(exc)))


def result_item(c: sc.Claimed, result: object, max_result_bytes: int) -> sc.Success | sc.Failure:
    """A finished body's outcome: its result as JSON, or a failure (no retry) when the result
    cannot be stored (not JSON, or over ``DTQ_MAX_RESULT_BYTES``)."""
    try:
        payload = "null"
        if result is not None:
            payload = codec.dumps(result, "the task's result")
            size = len(payload.encode())
            if size > max_result_bytes:
                raise SerializationError(
                    f"result is {size} bytes, over DTQ_MAX_RESULT_BYTES={max_result_bytes}"
                )
        return sc.Success.of(c, "succeeded", payload)
    except SerializationError as exc:
        return sc.Failure(c.tid, c.eid, c.attempt, f"unstorable result: {exc}", NO_RETRY)


def failure_item(c: sc.Claimed, exc: Exception, s: Settings) -> sc.Failure:
    """A body's exception as its failure: ``Retry`` retries (after its delay, or the backoff),
    ``Fail`` ends the task failed, a timeout or any other error retries after the backoff while
    retries are left (the script decides)."""
    if isinstance(exc, Retry):
        delay = retry_delay_ms(s, c.retries, exc.delay)
        return sc.Failure(c.tid, c.eid, c.attempt, f"Retry: {exc}", delay)
    if isinstance(exc, Fail):
        return sc.Failure(c.tid, c.eid, c.attempt, f"Fail: {exc}", NO_RETRY, traceback_text(exc))
    if isinstance(exc, TaskTimeout):
        return sc.Failure(c.tid, c.eid, c.attempt, str(exc), retry_delay_ms(s, c.retries))
    err = f"{type(exc).__name__}: {exc}"[:2000]
    return sc.Failure(
        c.tid, c.eid, c.attempt, err, retry_delay_ms(s, c.retries), traceback_text(exc)
    )
