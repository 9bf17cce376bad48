"""Metrics: worker and dtq-api /metrics scraped and parsed with prometheus_client's text parser,
values checked against what ran; the alert rules checked by promtool; a real Prometheus server
scraping both and answering PromQL; the Grafana dashboard only uses metrics that exist.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dtq import Client, Settings
from tests.api_proc import ApiProc
from tests.apt_tools import ensure_apt
from tests.conftest import ROOT, wait_until
from tests.redis_server import free_port

RULES = ROOT / "deploy" / "prometheus" / "dtq-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dtq-dashboard.json"


@pytest.fixture(scope="session")
def prometheus_bins() -> tuple[str, str]:
    prom = ensure_apt("prometheus", "prometheus")
    promtool = ensure_apt("promtool", "prometheus")
    return prom, promtool


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[Samples, set[str]]:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200
    samples: Samples = {}
    names: set[str] = set()
    for fam in text_string_to_metric_families(r.text):
        names.add(fam.name)
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, names


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    hits = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert hits, f"no sample {name}{labels}"
    return sum(hits)


@pytest.fixture
def fleet(settings: Settings, spawn_worker: Any) -> Iterator[dict[str, Any]]:
    """A worker subprocess serving /metrics and a dtq-api, after a known workload ran."""
    # A slower heartbeat than the suite's 0.2 s, so a loaded CI machine does not make the
    # worker look stale (3 missed intervals) in the middle of a liveness check.
    settings = settings.model_copy(update={"heartbeat_interval_s": 1.0, "visibility_timeout_s": 10})
    port = free_port()
    worker = spawn_worker("tests.apps.basic:app", settings, "--worker-id", "w-metrics",
                          DTQ_METRICS_PORT=str(port))  # fmt: skip
    api = ApiProc(settings)
    try:
        with Client(settings=settings) as c:
            adds = [c.enqueue("add", [i, i]) for i in range(4)]
            fails = [c.enqueue("fail_now") for _ in range(2)]
            held = [c.enqueue("add", [0, 0], queue="held", priority=7) for _ in range(3)]
            c.enqueue("add", [0, 0], delay=600)
            for h in adds:
                assert c.result(h.id, timeout=30) == 2 * int(c.get(h.id).args[0])
            for h in fails:
                with pytest.raises(Exception, match="ended failed"):
                    c.result(h.id, timeout=30)
        yield {
            "worker_url": f"http://127.0.0.1:{port}/metrics",
            "worker_port": port,
            "api": api,
            "ids": [h.id for h in adds + fails + held],
            "worker": worker,
        }
    finally:
        api.close()


@pytest.mark.slow
def test_worker_and_api_metrics_match_what_ran(fleet: dict[str, Any]) -> None:
    # Outcomes are written in batches: wait until the worker has counted them all.
    def counted() -> bool:
        s, _ = scrape(fleet["worker_url"])
        try:
            return value(s, "dtq_worker_tasks_total", outcome="failed") == 2
        except AssertionError:
            return False

    wait_until(counted, timeout=30)
    w, wnames = scrape(fleet["worker_url"])
    assert value(w, "dtq_worker_tasks_total", task="add", outcome="succeeded") == 4
    assert value(w, "dtq_worker_tasks_total", task="fail_now", outcome="failed") == 2
    assert value(w, "dtq_worker_tasks_total", worker_id="w-metrics") == 6
    assert value(w, "dtq_task_duration_seconds_count", queue="default", task="add") == 4
    assert value(w, "dtq_task_wait_seconds_count", queue="default") == 6
    assert value(w, "dtq_worker_inflight", worker_id="w-metrics") == 0
    assert value(w, "dtq_claims_lost_total") == 0
    for name in ("dtq_tasks_reclaimed", "dtq_duplicates_absorbed", "dtq_claims_lost",
                 "dtq_claim_seconds", "dtq_worker_heartbeat_age_seconds"):  # fmt: skip
        assert name in wnames

    a, _ = scrape(fleet["api"].url + "/metrics")
    assert value(a, "dtq_queue_depth", queue="held", priority="7") == 3
    assert value(a, "dtq_queue_depth", queue="held") == 3
    assert value(a, "dtq_queue_depth", queue="default") == 0
    assert value(a, "dtq_queue_scheduled", queue="default") == 1
    assert value(a, "dtq_dlq_depth", queue="default") == 2
    assert value(a, "dtq_dlq_depth", queue="held") == 0
    assert value(a, "dtq_workers_live") == 1
    assert value(a, "dtq_workers_stale") == 0
    assert value(a, "dtq_queue_oldest_waiting_seconds", queue="held") > 0
    assert value(a, "dtq_queue_paused", queue="held") == 0
    # Bounded labels: no task id or error text anywhere.
    for samples in (w, a):
        for _, labels in samples:
            for _, v in labels:
                assert not any(tid in v or tid.split(":")[1] in v for tid in fleet["ids"])
                assert "permanent problem" not in v
    keys = {k for (_, ls) in a for k, _ in ls}
    assert keys <= {"queue", "priority"}


def test_alert_rules_pass_promtool(prometheus_bins: tuple[str, str]) -> None:
    _, promtool = prometheus_bins
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 10 rules found" in r.stdout


def metric_names_in(expr: str) -> set[str]:
    return set(re.findall(r"\bdtq_[a-z_]+", expr))


def test_grafana_dashboard_and_rules_use_only_exported_metrics(
    settings: Settings, fleet: dict[str, Any]
) -> None:
    _, wnames = scrape(fleet["worker_url"])
    _, anames = scrape(fleet["api"].url + "/metrics")
    exported = wnames | anames
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][1]["definition"])
    exprs += re.findall(r"expr: \|?\s*\n?\s*(.+)", RULES.read_text())
    used = set().union(*(metric_names_in(e) for e in exprs))
    assert used
    for name in used:
        base = re.sub(r"_(bucket|count|sum|total)$", "", name)
        assert base in exported or name in exported, f"{name} is not exported"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


@pytest.mark.slow
def test_real_prometheus_scrapes_worker_and_api(
    prometheus_bins: tuple[str, str], fleet: dict[str, Any]
) -> None:
    prom, _ = prometheus_bins
    api_port = fleet["api"].url.rsplit(":", 1)[1]
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="dtq-prom-") as d:
        cfg = Path(d) / "prometheus.yml"
        (Path(d) / "dtq-alerts.yml").write_text(RULES.read_text())
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "rule_files: [dtq-alerts.yml]\n"
            "scrape_configs:\n"
            f"  - job_name: dtq-api\n    static_configs: [{{targets: ['127.0.0.1:{api_port}']}}]\n"
            f"  - job_name: dtq-worker\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{fleet['worker_port']}']}}]\n"
        )
        log = open(Path(d) / "prom.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [prom, f"--config.file={cfg}", f"--storage.tsdb.path={d}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}/api/v1/query"

            def query(q: str) -> list[Any]:
                try:
                    r = httpx.get(base, params={"query": q}, timeout=5)
                except httpx.HTTPError:
                    return []
                if r.status_code != 200:
                    return []
                return list(r.json()["data"]["result"])

            def answered(q: str, want: float) -> bool:
                res = query(q)
                return bool(res) and float(res[0]["value"][1]) == want

            q_ok = 'sum(dtq_worker_tasks_total{job="dtq-worker",outcome="succeeded"})'
            wait_until(lambda: answered(q_ok, 4), timeout=90, interval=0.5)
            wait_until(lambda: answered('sum(dtq_worker_tasks_total{outcome="failed"})', 2),
                       timeout=30, interval=0.5)  # fmt: skip
            # The API is its own scrape target: its gauges may land a scrape after the worker's.
            wait_until(lambda: answered('dtq_dlq_depth{job="dtq-api",queue="default"}', 2),
                       timeout=30, interval=0.5)  # fmt: skip
            wait_until(lambda: answered('sum(dtq_queue_depth{queue="held"})', 3),
                       timeout=30, interval=0.5)  # fmt: skip
            wait_until(lambda: answered("dtq_workers_live", 1), timeout=30, interval=0.5)
            up = query("up")
            assert {r["metric"]["job"]: r["value"][1] for r in up} == {
                "dtq-api": "1", "dtq-worker": "1"
            }  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()
