"""The ``--processes`` parent's port: one ``/metrics``, ``/healthz`` and ``/readyz`` for all
(how children's metrics merge: docs/operations.md, "Worker processes")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from threading import Lock

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

CHILD_TIMEOUT_S = 2.0  # below the k8s probes' 5 s; children are asked in parallel

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class Merged:
    """Families merged from several expositions (see the module doc for the rules)."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, str]] = {}  # name -> (doc, type, unit)
        self.values: dict[str, dict[SampleKey, float]] = {}

    def add_text(self, text: str, gauges: bool = True) -> None:
        for fam in text_string_to_metric_families(text):
            if fam.type == "gauge" and not gauges:
                continue
            self.families.setdefault(fam.name, (fam.documentation, fam.type, fam.unit))
            values = self.values.setdefault(fam.name, {})
            for s in fam.samples:
                if s.name.endswith("_created") and not gauges:
                    continue  # a dead child's start time says nothing about the live sum
                key = (s.name, tuple(sorted(s.labels.items())))
                old = values.get(key)
                if old is None:
                    values[key] = s.value
                elif s.name.endswith("_created"):
                    values[key] = min(old, s.value)
                elif fam.type == "gauge":
                    values[key] = max(old, s.value)
                else:
                    values[key] = old + s.value

    def add(self, other: Merged) -> None:
        for name, (doc, typ, unit) in other.families.items():
            self.families.setdefault(name, (doc, typ, unit))
            values = self.values.setdefault(name, {})
            for key, v in other.values[name].items():
                values[key] = values.get(key, 0.0) + v

    def metrics(self) -> Iterator[Metric]:
        for name, (doc, typ, unit) in self.families.items():
            m = Metric(name, doc, typ, unit)
            for (sname, labels), v in self.values[name].items():
                m.add_sample(sname, dict(labels), v)
            yield m


def fetch(port: int, path: str, timeout: float = CHILD_TIMEOUT_S) -> tuple[int, str]:
    """(HTTP status, body) of a child's endpoint; (0, why) when it did not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def child_word(status: int, body: str) -> str:
    """A child probe's answer as a word: "ok", or why not."""
    if status == 0:
        return f"not answering ({body})"
    try:
        word = json.loads(body).get("status")
    except (ValueError, AttributeError):
        word = None
    if word == "ok":  # (the status decides: a 503 is not ok whatever its body says)
        return "ok" if status == 200 else f"HTTP {status}"
    return str(word or f"HTTP {status}")


@dataclass
class ChildView:
    """What the parent knows of one slot at a probe: its port, once the child published it."""

    index: int
    port: int | None


class PoolEndpoints(Collector):
    """The collector for the parent's /metrics, and its two checks (``children``: the slots,
    without a port while a child starts; ``parent_live``: the supervision loop's liveness)."""

    def __init__(
        self,
        children: Callable[[], list[ChildView]],
        parent_live: Callable[[], str],
        stopping: Callable[[], bool],
        restarts: Callable[[], int],
    ) -> None:
        self._children = children
        self._parent_live = parent_live
        self._stopping = stopping
        self._restarts = restarts
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dtq-pool-http")
        self._lock = Lock()
        self._last: dict[int, str] = {}  # slot -> its child's last /metrics text
        self._retired = Merged()

    # --- metrics ------------------------------------------------------------------------------

    def retire(self, index: int) -> None:
        """The child of ``index`` died: keep the counters it last reported (module doc)."""
        with self._lock:
            if (text := self._last.pop(index, None)) is not None:
                self._retired.add_text(text, gauges=False)

    def collect(self) -> Iterator[Metric]:
        views = [v for v in self._children() if v.port is not None]
        answers = list(self._pool.map(lambda v: fetch(v.port or 0, "/metrics"), views))
        merged = Merged()
        with self._lock:
            merged.add(self._retired)
            for view, (status, text) in zip(views, answers, strict=True):
                if status == 200:
                    self._last[view.index] = text
                    merged.add_text(text)
        yield from merged.metrics()
        running = GaugeMetricFamily(
            "dtq_worker_processes", "Worker processes of this dtq-worker answering /metrics"
        )
        running.add_metric([], sum(1 for s, _ in answers if s == 200))
        yield running
        restarts = CounterMetricFamily(
            "dtq_worker_process_restarts", "Worker processes this dtq-worker restarted"
        )
        restarts.add_metric([], self._restarts())
        yield restarts

    def describe(self) -> Iterable[Metric]:
        return []  # names vary with what the children export: no clash checks to make

    # --- probes -------------------------------------------------------------------------------

    def _first_bad(self, path: str, views: list[ChildView]) -> str:
        """ "ok", or the first of ``views`` whose answer to ``path`` is not (asked in parallel)."""
        words = self._pool.map(lambda v: child_word(*fetch(v.port or 0, path)), views)
        for view, w in zip(views, words, strict=True):
            if w != "ok":
                return f"process {view.index}: {w}"
        return "ok"

    def live(self) -> str:
        """/healthz: the parent's loop turns and every child that is up answers its /healthz (a
        child being restarted counts as alive: the parent handles it)."""
        word = self._parent_live()
        if word != "ok":
            return f"parent: {word}"
        return self._first_bad("/healthz", [v for v in self._children() if v.port is not None])

    def ready(self) -> str:
        """/readyz: every child is up and says ready."""
        if self._stopping():
            return "draining"
        views = self._children()
        for v in views:
            if v.port is None:
                return f"process {v.index}: starting"
        return self._first_bad("/readyz", views)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
