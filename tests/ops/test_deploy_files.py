"""The files under deploy/ agree with each other and with what dtq serves.

Kubernetes manifests are rendered by kustomize (``kubectl kustomize``) and the KEDA ScaledObject is
checked against KEDA's schema; the Prometheus configs and alert rules by promtool (its rule unit
tests included); the Grafana dashboard and the compose file by what they must hold. The images and
the running stack are exercised by ``make docker-test`` (tests/docker_stack.py).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.apt_tools import ensure_apt
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KEDA_SCHEMA = K8S / "tests" / "keda-scaledobject.schema.json"
DASHBOARD = DEPLOY / "grafana" / "dtq-dashboard.json"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
# Metrics that carry a `queue` label (worker and API exporter).
QUEUE_LABELLED = {
    "dtq_worker_tasks_total", "dtq_task_duration_seconds", "dtq_task_wait_seconds",
    "dtq_queue_depth", "dtq_queue_scheduled", "dtq_queue_running", "dtq_dlq_depth",
    "dtq_queue_paused", "dtq_queue_oldest_waiting_seconds",
}  # fmt: skip


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         check=True, timeout=120).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return kustomize(K8S / request.param)


def test_keda_scaledobject_matches_kedas_schema(rendered: list[dict[str, Any]]) -> None:
    schema = json.loads(KEDA_SCHEMA.read_text())
    so = one(rendered, "ScaledObject", "dtq-worker")
    jsonschema.validate(so, schema)
    # The schema is not vacuous: typical mistakes are refused.
    for path, bad in ((("spec", "maxReplicas"), 5), (("spec", "triggers"), []),
                      (("spec", "fallback"), {"replicas": 2})):  # fmt: skip
        broken = copy.deepcopy(so)
        broken[path[0]][path[1]] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    broken = copy.deepcopy(so)
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 16  # metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_scaledobject_targets_the_worker_deployment_with_exported_metrics(
    rendered: list[dict[str, Any]],
) -> None:
    so = one(rendered, "ScaledObject", "dtq-worker")
    target = so["spec"]["scaleTargetRef"]
    deployment = one(rendered, "Deployment", target["name"])
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "dtq-worker"
    exporter = (ROOT / "apps" / "api" / "dtq_api" / "metrics.py").read_text()
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    names = set(re.findall(r"\bdtq_[a-z_]+", query))
    assert names and all(f'"{n}"' in exporter for n in names), names


def config_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(
        "dtq-config")]  # fmt: skip
    assert len(cms) == 1
    data: dict[str, str] = cms[0]["data"]
    return data


def test_worker_pods_drain_before_they_are_killed_and_probe_the_worker_port(
    rendered: list[dict[str, Any]],
) -> None:
    cfg = config_of(rendered)
    pod = one(rendered, "Deployment", "dtq-worker")["spec"]["template"]["spec"]
    drain = float(cfg["DTQ_DRAIN_TIMEOUT_S"]) + float(cfg["DTQ_HARD_EXIT_S"])
    assert pod["terminationGracePeriodSeconds"] > drain
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(cfg["DTQ_METRICS_PORT"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
    pdb = one(rendered, "PodDisruptionBudget", "dtq-worker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(rendered).items()
    svc = one(rendered, "Service", "dtq-worker")
    assert svc["spec"]["selector"].items() <= pod_labels(rendered).items()
    monitors = [d for d in rendered if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"dtq-worker", "dtq-api"}


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = one(docs, "Deployment", "dtq-worker")["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel.get("targets", []) if "expr" in t]


def test_grafana_panels_over_queue_labelled_metrics_honour_the_queue_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    unfiltered = []
    for panel in dash["panels"]:
        for expr in exprs(panel):
            for m in re.finditer(r"\b(dtq_[a-z_]+?)(_bucket|_count|_sum)?\b(\{[^}]*\})?", expr):
                if m.group(1) in QUEUE_LABELLED and 'queue=~"$queue"' not in (m.group(3) or ""):
                    unfiltered.append(f"{panel['title']}: {m.group(0)}")
    assert not unfiltered, unfiltered


def test_compose_stack_is_durable_and_scraped_by_discovery() -> None:
    stack = yaml.safe_load(COMPOSE.read_text())
    services = stack["services"]
    redis_cmd = " ".join(services["redis"]["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in redis_cmd
    workers = [n for n, s in services.items() if s.get("command") == ["dtq-worker"]]
    assert len(workers) >= 2
    prom = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "dtq-worker"]
    (sd,) = job["dns_sd_configs"]
    for w in workers:
        s = services[w]
        assert sd["names"][0] in s["networks"]["default"]["aliases"]
        assert int(s["environment"]["DTQ_METRICS_PORT"]) == sd["port"]
        grace = float(s["stop_grace_period"].rstrip("s"))
        assert grace > 30, "above the default DTQ_DRAIN_TIMEOUT_S"
    assert "env_file" in services["api"]
    # Grafana: the provisioned datasource is Prometheus at the stack's address, and the
    # dashboards provider reads the folder the dashboard JSON is mounted into.
    prov = DEPLOY / "grafana" / "provisioning"
    (ds,) = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" and ds["isDefault"]
    (provider,) = yaml.safe_load((prov / "dashboards" / "dtq.yaml").read_text())["providers"]
    mounts = [v.split(":") for v in services["grafana"]["volumes"]]
    dash_target = [t for src, t, *_ in mounts if src.endswith("dtq-dashboard.json")]
    assert dash_target and Path(dash_target[0]).parent == Path(provider["options"]["path"])
    assert ["../grafana/provisioning", "/etc/grafana/provisioning", "ro"] in mounts
    var = json.loads(DASHBOARD.read_text())["templating"]["list"][0]
    assert var["type"] == "datasource" and var["query"] == ds["type"]


@pytest.fixture(scope="module")
def promtool() -> str:
    return ensure_apt("promtool", "prometheus")


@pytest.mark.parametrize("config", ["prometheus/prometheus.yml", "compose/prometheus.yml"])
def test_prometheus_configs_pass_promtool(promtool: str, config: str, tmp_path: Path) -> None:
    # Both load the rules file from beside them (as in the compose stack's /etc/prometheus).
    shutil.copy(DEPLOY / config, tmp_path / "prometheus.yml")
    shutil.copy(DEPLOY / "prometheus" / "dtq-alerts.yml", tmp_path / "dtq-alerts.yml")
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def test_alert_rules_fire_as_their_unit_tests_expect(promtool: str) -> None:
    tests = DEPLOY / "prometheus" / "tests" / "dtq-alerts.test.yml"
    r = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr
