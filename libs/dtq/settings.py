"""Settings, read from ``DTQ_*`` environment variables and validated once at start.

Each field documents itself; docs/configuration.md's table is generated from the same names.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dtq.errors import ConfigError, InvalidRequest
from dtq.logs import CONTROL_RE as CONTROL_RE
from dtq.store import partitions
from dtq.store.keys import QUEUE_NAME_RE

WORKER_ID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def check_queue_name(q: object) -> None:
    """InvalidRequest (a ValueError, as the settings' checks raise) for a bad queue name."""
    if not isinstance(q, str) or not QUEUE_NAME_RE.fullmatch(q):
        raise InvalidRequest(f"bad queue name {q!r}: use letters, digits, '_', '.', '-'")


class Settings(BaseSettings):
    """All of dtq's settings. Environment variables carry the ``DTQ_`` prefix."""

    model_config = SettingsConfigDict(env_prefix="DTQ_", extra="ignore", frozen=True)

    redis_url: str = "redis://localhost:6379/0"
    """Where Redis is: ``redis://``, ``rediss://`` (TLS), ``unix://``,
    ``redis+sentinel://host:port[,host:port]/service[/db]`` or
    ``redis+cluster://host:port[,host:port]`` (docs/configuration.md)."""
    key_prefix: str = "dtq"
    """Namespace of every key; two prefixes on one Redis never see each other."""
    queues: Annotated[tuple[str, ...], NoDecode] = ("default",)
    """Queues a worker consumes, comma separated, in order of preference."""
    worker_concurrency: int = Field(16, gt=0, le=10_000)
    """Task bodies running at once per worker process (a run writing its outcome holds none)."""
    worker_processes: int = Field(1, ge=1, le=256)
    """Worker processes ``dtq-worker`` runs (``--processes``). Above 1, a parent supervises that
    many full workers (ids ``<DTQ_WORKER_ID>-<i>``, or generated), restarts one that dies and
    serves one DTQ_METRICS_PORT for all (docs/operations.md, "Worker processes")."""
    worker_prefetch: int = Field(0, ge=0, le=10_000)
    """Runs a worker claims ahead, beyond its concurrency, to start the moment a body ends (no
    claim round trip between two runs). While they wait they count as running (leased by the
    heartbeat); a stop hands them back with no interruption counted. For short tasks; keep 0
    for long ones (docs/design.md, "Claiming ahead")."""
    queue_concurrency: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    """Per-queue caps on one worker's slots, e.g. ``bulk=4,critical=12`` (each 1 to
    DTQ_WORKER_CONCURRENCY), so a slow queue cannot take every slot."""
    group_concurrency: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    """Per-queue caps on the running tasks of each fair group of that queue across all
    workers, e.g. ``tenants=4,reports=1`` (each at least 1): a group at its cap is passed over
    in its turn while the queue's other groups run (docs/groups.md). Unset: no cap."""
    queue_partitions: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    """Queues split into partitions, e.g. ``bulk=4`` (each 1 to 256): each partition has its own
    hash tag, so one queue spreads over a Redis Cluster's shards. Clients and workers must agree
    (the count is recorded in Redis; docs/operations.md, "Partitioned queues")."""
    fair: bool = False
    """Weighted selection across priority bands (band p weighs p+1) instead of strict priority,
    so a flood in one band cannot starve the others."""
    heartbeat_interval_s: float = Field(5.0, gt=0)
    """Worker heartbeat period."""
    heartbeat_ttl_s: float | None = Field(None, gt=0)
    """How long a worker may go without a successful heartbeat before it stops itself
    (exit code 1). Default: 3 heartbeat intervals."""
    visibility_timeout_s: float = Field(30.0, gt=0)
    """Idle time after which a dead worker's entry is reclaimed by another worker."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """Graceful-shutdown wait for running tasks before they are handed back."""
    hard_exit_s: float = Field(15.0, gt=0)
    """After the drain, the process exits by this deadline even if threads refuse to stop."""
    worker_id: str = Field(default_factory=lambda: "worker-" + secrets.token_hex(4))
    """Consumer name, scheduler lock token and metrics label."""
    retry_backoff_s: float = Field(1.0, ge=0)
    """First retry delay; doubles each attempt, with jitter."""
    retry_backoff_max_s: float = Field(300.0, ge=0)
    """Cap on the retry delay."""
    max_interruptions: int = Field(3, ge=0)
    """Shutdown hand-backs per task that spend no attempt; later ones count as failures."""
    declaration_grace_s: float = Field(300.0, gt=0)
    """Rolling deploys: while a live worker consuming a queue declared a task name within this
    many seconds, a worker that does not know the name hands its tasks back (spending nothing)
    instead of failing them; and the scheduler leader removes a code schedule only once no live
    worker declared it for this long (docs/operations.md, "Rolling deploys")."""
    result_ttl_s: int = Field(86_400, gt=0)
    """How long finished task records and their results are kept (seconds)."""
    dlq_ttl_s: int = Field(7 * 86_400, gt=0)
    """How long failed tasks stay listed in the dead-letter queue (seconds)."""
    max_payload_bytes: int = Field(1_048_576, gt=0)
    """Largest encoded arguments accepted at enqueue."""
    max_result_bytes: int = Field(1_048_576, gt=0)
    """Largest encoded result stored; a larger one ends the task failed."""
    client_retries: int = Field(3, ge=0, le=10)
    """How often an SDK, CLI or API call is re-sent after a connection blip (reset, refused,
    timed out), with a jittered backoff from 50 ms up to 1 s; 0 raises at once. Only calls
    that are safe to re-send are (docs/client.md, "Connection blips")."""
    client_coalesce: bool = True
    """Single enqueues to one queue that a client's coroutines or threads make while one is in
    flight go out together as one bulk call when it returns (the first goes out at once). 0
    sends every enqueue on its own."""
    client_warn_undeclared: bool = True
    """A client's first enqueue by name of each queue and task name checks (one read, again at
    most every 5 minutes) that a live worker declared the name within DTQ_DECLARATION_GRACE_S,
    and issues ``dtq.UndeclaredTaskWarning`` once if none did, as ``dtq enqueue`` warns. 0 skips
    the check."""
    fast_lane: bool = True
    """Send script calls on dtq's fast lane: a kept connection written to directly, skipping
    redis-py's per-call layers (dtq/store/transport.py). Off (logged once) where the installed
    redis-py lacks what it needs; 0 turns it off. The worker's gauge ``dtq_fast_lane_enabled``
    says which."""
    events_maxlen: int = Field(10_000, ge=0)
    """Approximate cap of each queue's lifecycle event stream, in entries (one entry holds the
    events of one claim, completion or bulk enqueue); 0 disables events."""
    stats_retention_h: int = Field(168, ge=0, le=24 * 366)
    """Hours of history kept: per-minute counts per queue (enqueued, succeeded, failed, retried,
    cancelled, run-time percentiles) that ``GET /api/v1/stats``, ``dtq stats`` and the dashboard
    read; about 100 KB per queue per day at most (docs/operations.md, "History"). 0 keeps
    none."""
    dlq_max: int = Field(100_000, ge=0)
    """Most dead letters kept per queue (the oldest are pruned first); 0 means no cap."""
    retention_interval_s: float = Field(60.0, gt=0)
    """Period of the retention pass (one worker at a time prunes what outlived its age/cap)."""
    dead_worker_ttl_s: float = Field(3600.0, gt=0)
    """A worker silent this long is dropped from the worker list and its consumers deleted."""
    metrics_port: int | None = Field(None, ge=1, le=65535)
    """When set, the worker serves Prometheus ``/metrics`` on this port, and its probes:
    ``/healthz`` (the process and its event loop answer) and ``/readyz`` (Redis reachable and
    heartbeats landing)."""
    api_token: str | None = None
    """When set, every ``/api/v1`` call needs ``Authorization: Bearer <token>``."""
    api_max_body_bytes: int | None = Field(None, gt=0)
    """Largest request body dtq-api reads (413 past it, counted while reading, chunked or
    not). Default: DTQ_MAX_PAYLOAD_BYTES plus 64 KiB for the JSON around the arguments."""
    api_max_streams: int = Field(1000, gt=0, le=100_000)
    """Most concurrent ``/api/v1/events`` streams per dtq-api process (503 with Retry-After
    past it). All streams share one Redis connection."""
    api_allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    """Host names dtq-api answers for (comma separated), on every request, besides loopback
    names when bound to loopback, the bound name and any IP address; another ``Host`` gets 403
    (a DNS-rebound page). Unset and bound beyond loopback: any Host."""
    log_format: Literal["text", "json"] = "text"
    """``text`` for a terminal, ``json`` for log shippers."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level (any case) of the ``dtq`` loggers and, in a worker, of the records tasks log
    through their own loggers (``logging.getLogger(__name__)`` in a task body)."""
    log_tasks: Literal["failures", "outcomes", "all"] = "failures"
    """Which runs a worker logs a line for: ``failures``, a task that fails (ERROR, with its
    traceback) or is retried (INFO); ``outcomes``, also a line (INFO) for every other run that
    ends; ``all``, also a line when each run starts. Per-task lines cost a worker about a third
    of its CPU per short task (docs/operations.md, "Logs"); the queue's event stream records
    every run either way."""

    @field_validator("log_level", "log_tasks", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("queues", "api_allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if info.field_name == "api_allowed_hosts":
                value = [h.lower() for h in value]
        return value

    # --- tracing (dtq.contrib.otel) ---
    tracing: bool = False
    """OpenTelemetry spans for every enqueue (by a client that knows the app) and every run,
    linked by a W3C trace context carried with the task. Needs ``pip install 'dtq[otel]'``;
    ``App(tracing=...)`` overrides it. Spans go to the global tracer provider."""

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one queue is needed")
        for q in value:
            check_queue_name(q)
        if len(set(value)) != len(value):
            raise ValueError("a queue is listed twice")
        return value

    @field_validator("api_token")
    @classmethod
    def _check_token(cls, value: str | None) -> str | None:
        # A token pasted with its newline could never match a header (clients strip it).
        if value is not None and (not value or value != value.strip() or not value.isprintable()):
            raise ValueError(
                "must be non-empty without surrounding spaces, newlines or control characters"
            )
        return value

    @field_validator("queue_concurrency", "queue_partitions", "group_concurrency", mode="before")
    @classmethod
    def _split_pairs(cls, value: object) -> object:
        """``bulk=4,other=2`` as a dict (the field's own validation checks names and numbers)."""
        if not isinstance(value, str):
            return value
        out: dict[str, object] = {}
        for part in value.split(","):
            if not part.strip():
                continue
            name, sep, num = part.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"wants queue=N pairs, got {part.strip()!r}")
            out[name.strip()] = num.strip()
        return out

    @field_validator("queue_concurrency", "queue_partitions", "group_concurrency")
    @classmethod
    def _check_counts(cls, value: dict[str, int], info: ValidationInfo) -> dict[str, int]:
        for q, n in value.items():
            check_queue_name(q)
            if info.field_name == "group_concurrency" and n < 1:
                raise ValueError(f"{q}={n}: a group's cap is at least 1")
            if info.field_name == "queue_partitions" and not 1 <= n <= partitions.MAX_PARTITIONS:
                raise ValueError(f"{q}={n}: a count is 1 to {partitions.MAX_PARTITIONS}")
        return value

    def group_cap(self, queue: str) -> int:
        """How many tasks of one fair group of ``queue`` (a physical queue: a partition counts
        as its queue) may run at once across the fleet; 0: no cap."""
        if not self.group_concurrency:
            return 0
        return self.group_concurrency.get(partitions.logical(queue), 0)

    @field_validator("redis_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parsed = urlparse(value)
        if parsed.scheme in ("redis+sentinel", "redis+cluster", "rediss+cluster"):
            from dtq.store.connection import parse_cluster_url, parse_sentinel_url

            sentinel = parsed.scheme == "redis+sentinel"
            (parse_sentinel_url if sentinel else parse_cluster_url)(value)
            return value
        if parsed.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                "must start with redis://, rediss://, unix://, redis+sentinel:// "
                "or redis+cluster://"
            )
        if parsed.scheme != "unix" and not parsed.hostname:
            raise ValueError("has no host")
        try:
            parsed.port  # noqa: B018 - raises on a non-numeric port
        except ValueError as exc:
            raise ValueError(f"bad port ({exc})") from None
        check_url_options(value)
        return value

    @field_validator("key_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not value or any(c in value for c in "{}: ") or CONTROL_RE.search(value):
            raise ValueError(
                "must be non-empty without braces, colons, spaces or control characters"
            )
        return value

    @field_validator("worker_id")
    @classmethod
    def _check_worker_id(cls, value: str) -> str:
        if not WORKER_ID_RE.fullmatch(value):
            raise ValueError("use 1-64 letters, digits, '_', '.', '-'")
        return value

    @model_validator(mode="after")
    def _check_timing(self) -> Settings:
        if self.heartbeat_interval_s >= self.visibility_timeout_s:
            raise ValueError(
                "DTQ_HEARTBEAT_INTERVAL_S must be smaller than DTQ_VISIBILITY_TIMEOUT_S "
                f"({self.heartbeat_interval_s} >= {self.visibility_timeout_s})"
            )
        if self.retry_backoff_s > self.retry_backoff_max_s:
            raise ValueError("DTQ_RETRY_BACKOFF_S must not exceed DTQ_RETRY_BACKOFF_MAX_S")
        for q, cap in self.queue_concurrency.items():
            if not 1 <= cap <= self.worker_concurrency:
                raise ValueError(
                    f"DTQ_QUEUE_CONCURRENCY {q}={cap} must be between 1 and "
                    f"DTQ_WORKER_CONCURRENCY ({self.worker_concurrency})"
                )
        return self

    @property
    def effective_heartbeat_ttl_s(self) -> float:
        return self.heartbeat_ttl_s or 3 * self.heartbeat_interval_s


def check_url_options(url: str) -> None:
    """Raise ValueError naming a query option of ``url`` redis-py would refuse (a bad number,
    an unknown name) now, not as a traceback at the first connection. Connects to nothing."""
    import redis

    try:
        redis.ConnectionPool.from_url(url).make_connection()
    except (ValueError, TypeError) as exc:
        detail = str(exc).rpartition("__init__() ")[2]
        raise ValueError(f"bad option: {detail}") from None


def checked_redis_url(url: str) -> str:
    """``url`` if it is a valid DTQ_REDIS_URL, else :class:`ConfigError` naming the setting."""
    try:
        return Settings._check_url(url)
    except ValueError as exc:
        raise ConfigError(f"invalid setting DTQ_REDIS_URL: {exc}") from None


def load_settings(flags: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Read settings from the environment (plus ``overrides``); raise ConfigError on one line.

    ``flags``: the command-line flag each override came from (field -> flag), so a bad value
    given as a flag is reported by the flag's name, not the variable's."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "__root__"]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc:
        raise ConfigError(f"invalid settings: {msg}")
    what = flags[loc[0]] if flags and loc[0] in flags else f"setting DTQ_{loc[0].upper()}"
    raise ConfigError(f"invalid {what}: {msg}")
