"""``make docker-test``: build the images, lint deploy/, run the compose stack and use it.

    python -m tests.docker_stack        (root on Debian; installs what it lacks with apt-get)

What it checks, in order (each printed as it passes):
1. hadolint on the Dockerfiles; kustomize renders of deploy/k8s validated by kubernetes-validate;
   tests/ops/test_deploy_files.py (the KEDA ScaledObject against KEDA's schema, promtool on the
   Prometheus configs and alert unit tests, dashboard and compose consistency).
2. A private dockerd; every image built from a local debootstrap base (nothing pulled).
3. The compose stack up (Redis AOF, two workers, the API, Prometheus): the API refuses a call
   without its token; tasks enqueued through it succeed; Prometheus has found both workers by
   DNS and holds their counters; both workers report healthy through the image's HEALTHCHECK.
4. ``docker stop`` on the worker running a long task: it exits 0 after handing the task back,
   and the other worker finishes it.
5. Everything torn down: the stack, its volumes, dockerd.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT
from tests.docker_env import Dockerd, build_images, ensure_tools, import_base, run, say
from tests.redis_server import free_port

COMPOSE_DIR = ROOT / "deploy" / "compose"
PROJECT = "dtqtest"
IMAGE = "dtq:test"
BIN = Path(sys.executable).parent
T0 = time.monotonic()
PASSED: list[str] = []


def check(msg: str) -> None:
    PASSED.append(msg)
    say(f"ok  {msg}  [{time.monotonic() - T0:.0f}s]")


def wait_for(what: str, pred: Callable[[], Any], timeout: float = 90, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def lint() -> None:
    dockerfiles = [ROOT / "deploy/docker/Dockerfile", ROOT / "deploy/docker/local/Dockerfile"]
    run([str(BIN / "hadolint"), *map(str, dockerfiles)])
    check("hadolint: deploy/docker/Dockerfile, deploy/docker/local/Dockerfile")
    with tempfile.TemporaryDirectory() as tmp:
        for kpath in ("base", "overlays/example"):
            out = Path(tmp) / (kpath.replace("/", "-") + ".yaml")
            out.write_text(run(["kubectl", "kustomize", str(ROOT / "deploy/k8s" / kpath)],
                               capture_output=True).stdout)  # fmt: skip
            run([str(BIN / "kubernetes-validate"), "--strict", "--quiet", str(out)],
                capture_output=True)  # fmt: skip
            check(f"kubectl kustomize deploy/k8s/{kpath} | kubernetes-validate --strict "
                  "(core kinds; KEDA and Prometheus Operator kinds next)")  # fmt: skip
    run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
         "tests/ops/test_deploy_files.py"], cwd=ROOT)  # fmt: skip
    check(
        "ScaledObject vs KEDA's schema, promtool check config/rules + rule unit tests, "
        "dashboard $queue filters, compose consistency (tests/ops/test_deploy_files.py)"
    )


class Stack:
    def __init__(self, d: Dockerd, workdir: Path) -> None:
        self.d = d
        self.token = secrets.token_hex(16)
        env_file = workdir / "api.env"
        env_file.write_text(f"DTQ_API_TOKEN={self.token}\n")
        self.api_port, self.prom_port = free_port(), free_port()
        self.env = dict(
            d.env,
            DTQ_IMAGE=IMAGE,
            DTQ_REDIS_IMAGE="dtq-local-redis:bookworm",
            DTQ_PROMETHEUS_IMAGE="dtq-local-prometheus:bookworm",
            DTQ_API_ENV_FILE=str(env_file),
            DTQ_API_PORT=str(self.api_port),
            DTQ_PROMETHEUS_PORT=str(self.prom_port),
        )
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.prom = f"http://127.0.0.1:{self.prom_port}"
        self.auth = {"Authorization": f"Bearer {self.token}"}

    def compose(self, *args: str, capture: bool = False) -> str:
        cmd = ["docker-compose", "-p", PROJECT, "-f", "compose.yaml", "-f", "compose.test.yaml"]
        r = run([*cmd, *args], cwd=COMPOSE_DIR, env=self.env, capture_output=capture)
        return r.stdout or ""

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service, capture=True).strip()

    def inspect(self, cid: str, fmt: str) -> str:
        return self.d.docker("inspect", "-f", fmt, cid, capture=True).strip()

    def up(self) -> None:
        # Grafana is not in Debian: the test runs the stack without it (its provisioning and
        # dashboard are checked by tests/ops/test_deploy_files.py and test_prometheus.py).
        self.compose("up", "-d", "--no-build", "redis", "worker-a", "worker-b", "api",
                     "prometheus")  # fmt: skip
        wait_for("dtq-api /readyz", lambda: httpx.get(self.api + "/readyz").status_code == 200)
        check("compose up: redis (AOF), worker-a, worker-b, api, prometheus; api ready")

    def enqueue(self, name: str, args: list[Any]) -> str:
        r = httpx.post(self.api + "/api/v1/tasks", json={"name": name, "args": args},
                       headers=self.auth, timeout=10)  # fmt: skip
        assert r.status_code in (200, 201), r.text
        tid: str = r.json()["id"]
        return tid

    def task(self, tid: str) -> dict[str, Any]:
        r = httpx.get(f"{self.api}/api/v1/tasks/{tid}", headers=self.auth, timeout=10)
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def promql(self, query: str) -> list[dict[str, Any]]:
        r = httpx.get(self.prom + "/api/v1/query", params={"query": query}, timeout=10)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def tasks_succeed(self, n: int = 20) -> None:
        r = httpx.post(self.api + "/api/v1/tasks", json={"name": "examples.add", "args": [1, 2]},
                       timeout=10)  # fmt: skip
        assert r.status_code == 401, f"no token: expected 401, got {r.status_code}"
        ids = [self.enqueue("examples.add", [i, 100]) for i in range(n)]
        for i, tid in enumerate(ids):
            done = wait_for(f"task {tid}", lambda t=tid: self.task(t)["status"] == "succeeded")
            assert done and self.task(tid)["result"] == i + 100
        ran_on = {self.task(t)["worker_id"] for t in ids}
        check(
            f"API: 401 without the token; {n} tasks enqueued with it all succeeded "
            f"(ran on {', '.join(sorted(ran_on))})"
        )

    def prometheus_sees_workers(self, n: int) -> None:
        targets = wait_for("both workers discovered and up", lambda: len(
            self.promql('up{job="dtq-worker"} == 1')) == 2, timeout=60)  # fmt: skip
        assert targets
        q = 'sum(dtq_worker_tasks_total{task="examples.add",outcome="succeeded"})'
        wait_for("worker counters in Prometheus",
                 lambda: float(self.promql(q)[0]["value"][1]) >= n, timeout=60)  # fmt: skip
        wait_for("API exporter in Prometheus",
                 lambda: float(self.promql("dtq_workers_live")[0]["value"][1]) == 2)  # fmt: skip
        check(
            f"Prometheus: 2 workers found by DNS service discovery; {q} >= {n}; "
            "dtq_workers_live == 2 from the API exporter"
        )

    def healthchecks_pass(self) -> None:
        for svc in ("worker-a", "worker-b", "api"):
            cid = self.container(svc)
            wait_for(f"{svc} HEALTHCHECK", lambda c=cid: self.inspect(
                c, "{{.State.Health.Status}}") == "healthy", timeout=90)  # fmt: skip
        check("HEALTHCHECK healthy: worker-a, worker-b (/healthz on 9191), api (/healthz)")

    def stopped_worker_hands_back(self) -> None:
        tid = self.enqueue("examples.sleep", [10])
        running = wait_for(
            "the long task to start", lambda: (t := self.task(tid))["status"] == "running" and t
        )
        victim = running["worker_id"]
        other = ({"worker-a", "worker-b"} - {victim}).pop()
        cid = self.container(victim)
        t0 = time.monotonic()
        self.d.docker("stop", "-t", "30", cid, capture=True)
        took = time.monotonic() - t0
        code = self.inspect(cid, "{{.State.ExitCode}}")
        assert code == "0", f"{victim} exited {code} (SIGTERM not delivered through tini?)"
        logs = subprocess.run(["docker", "logs", cid], env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True).stdout  # fmt: skip
        assert "handed back" in logs, logs[-2000:]
        done = wait_for(
            "the task finished by the other worker",
            lambda: (t := self.task(tid))["status"] == "succeeded" and t,
            timeout=90,
        )
        assert done["worker_id"] == other, done
        assert done["interruptions"] >= 1 and done["attempt"] >= 2, done
        check(
            f"docker stop {victim} mid-task: exit 0 after {took:.1f}s (drained, handed back); "
            f"{other} finished it (attempt {done['attempt']}, "
            f"interruptions {done['interruptions']})"
        )
        q = f'dtq_worker_tasks_total{{task="examples.sleep",worker_id="{other}"}}'
        wait_for("the handed-back run counted in Prometheus",
                 lambda: float(self.promql(q)[0]["value"][1]) == 1, timeout=60)  # fmt: skip
        check(f"Prometheus: {q} == 1")

    def demo_traffic_flows(self) -> None:
        # examples.resize is enqueued by the demo service only.
        q = 'sum(dtq_worker_tasks_total{task="examples.resize",outcome="succeeded"})'
        self.compose("--profile", "demo", "up", "-d", "--no-build", "demo", capture=True)
        wait_for("demo tasks counted in Prometheus",
                 lambda: float(self.promql(q)[0]["value"][1]) >= 5, timeout=90)  # fmt: skip
        self.compose("--profile", "demo", "stop", "-t", "5", "demo", capture=True)
        check(f"compose --profile demo up demo: its tasks run and show in Prometheus ({q} >= 5)")

    def down(self) -> None:
        self.compose("--profile", "demo", "down", "-v", "-t", "10", capture=True)
        check("compose down -v")


def main() -> int:
    ensure_tools()
    lint()
    d = Dockerd().start()
    try:
        import_base(d)
        build_images(d, IMAGE)
        check("images built with no registry")
        with tempfile.TemporaryDirectory(prefix="dtq-stack-") as tmp:
            stack = Stack(d, Path(tmp))
            try:
                stack.up()
                stack.tasks_succeed(20)
                stack.prometheus_sees_workers(20)
                stack.healthchecks_pass()
                stack.stopped_worker_hands_back()
                stack.demo_traffic_flows()
            except BaseException:
                say("FAILED; last logs of the stack:")
                subprocess.run(["docker-compose", "-p", PROJECT, "-f", "compose.yaml", "-f",
                                "compose.test.yaml", "logs", "--tail", "40"],
                               cwd=COMPOSE_DIR, env=stack.env)  # fmt: skip
                raise
            finally:
                stack.down()
    finally:
        d.stop()
    say(f"all checks passed in {time.monotonic() - T0:.0f}s")
    print(f"docker-test: {len(PASSED)} passed, 0 failed", flush=True)
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
