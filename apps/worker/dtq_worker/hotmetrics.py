"""Per-run metrics updated without locks (the event loop thread alone updates them), exported
at scrape time (docs/performance.md, "Hand-written code")."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

# prometheus_client's default buckets.
_SUB_SECOND = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75)
DEFAULT_BUCKETS = (*_SUB_SECOND, 1.0, 2.5, 5.0, 7.5, 10.0, float("inf"))


class HotHistogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class HotHistogramFamily(Collector):
    def __init__(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labels)
        self.bounds = tuple(buckets)
        self._children: dict[tuple[str, ...], HotHistogram] = {}
        self._le = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        registry.register(self)

    def labels(self, *values: str) -> HotHistogram:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HotHistogram(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, h in list(self._children.items()):
            counts = h.counts.copy()
            fam.add_metric(
                list(values), list(zip(self._le, accumulate(counts), strict=True)), h.sum
            )
        yield fam

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)


class HotCounter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class HotCounterFamily(Collector):
    def __init__(
        self, name: str, doc: str, labels: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labels)
        self._children: dict[tuple[str, ...], HotCounter] = {}
        registry.register(self)

    def labels(self, *values: str) -> HotCounter:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HotCounter()
        return child

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, c in list(self._children.items()):
            fam.add_metric(list(values), c.value)
        yield fam

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
