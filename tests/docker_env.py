"""A private Docker engine and a local Debian base image, for ``make docker-test``.

No image registry is reachable here, so every image is built FROM a base made with
``debootstrap --variant=minbase bookworm`` and ``docker import`` (the rootfs tarball is cached in
build/docker/). dockerd runs with its socket and state in a fresh folder under /tmp (outside the
build context) and its image store in DTQ_DOCKER_DATA (default /tmp/dtq-docker-cache: kept between
runs so warm runs reuse layers; ``make docker-clean`` drops it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.conftest import ROOT

BUILD = ROOT / "build" / "docker"
BASE_TAR = BUILD / "base-bookworm.tar"
BASE_IMAGE = "dtq-local-base:bookworm"
EXTRA_CA = Path("/usr/local/share/ca-certificates")
APT_TOOLS = {"dockerd": "docker.io", "docker-compose": "docker-compose",
             "debootstrap": "debootstrap", "promtool": "prometheus"}  # fmt: skip


def say(msg: str) -> None:
    print(f"[docker-test] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]


def ensure_tools() -> None:
    """Install the Debian packages the run needs (root on Debian, as here and in CI)."""
    missing = sorted({pkg for tool, pkg in APT_TOOLS.items() if not shutil.which(tool)})
    if shutil.which("kubectl") is None:
        raise SystemExit("kubectl is needed for `kubectl kustomize` (Debian 12 does not package "
                         "it; install it from Kubernetes' apt repository)")  # fmt: skip
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"missing {' '.join(missing)}: apt-get install them (needs root)")
    say(f"apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
        stdout=subprocess.DEVNULL)  # fmt: skip


class Dockerd:
    """dockerd on a private socket; stopped (and its state folder removed) by ``stop``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dtq-docker-", dir="/tmp"))
        self.data = Path(os.environ.get("DTQ_DOCKER_DATA", "/tmp/dtq-docker-cache"))
        self.sock = self.dir / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{self.sock}", DOCKER_BUILDKIT="0")

    def start(self) -> Dockerd:
        self.data.mkdir(parents=True, exist_ok=True)
        log = (self.dir / "dockerd.log").open("wb")
        # --iptables=false: the host's firewall is left alone. Containers on the stack's own
        # bridge reach each other without it; published ports go through docker-proxy; builds
        # use the host's network (docker build --network host).
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.data), "--exec-root", str(self.dir / "exec"),
             "-H", f"unix://{self.sock}", "--pidfile", str(self.dir / "docker.pid"),
             "--iptables=false", "--ip-masq=false", "--bridge=none"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=self.env, capture_output=True).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"dockerd did not start; see {self.dir / 'dockerd.log'}")
            time.sleep(0.5)
        say(f"dockerd up (socket {self.sock}, images in {self.data})")
        return self

    def docker(self, *args: str, capture: bool = False) -> str:
        r = run(["docker", *args], env=self.env, capture_output=capture)
        return r.stdout or ""

    def has_image(self, ref: str) -> bool:
        r = subprocess.run(["docker", "image", "inspect", ref], env=self.env, capture_output=True)
        return r.returncode == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            say("dockerd stopped")
        self.proc = None
        # dockerd leaves its default network namespace mounted in its exec root.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(self.dir))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def base_tarball() -> Path:
    """The minbase bookworm rootfs (with this machine's extra CAs) as a tarball; cached."""
    if BASE_TAR.exists():
        return BASE_TAR
    BUILD.mkdir(parents=True, exist_ok=True)
    rootfs = BUILD / "rootfs.tmp"
    shutil.rmtree(rootfs, ignore_errors=True)
    say("debootstrap --variant=minbase bookworm (cached in build/docker afterwards)")
    mirror = os.environ.get("DTQ_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    run(["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm",
         str(rootfs), mirror], stdout=subprocess.DEVNULL)  # fmt: skip
    # PyPI and Debian traffic may pass a proxy with its own CA: trust what this machine trusts.
    for crt in EXTRA_CA.glob("*.crt") if EXTRA_CA.is_dir() else []:
        shutil.copy(crt, rootfs / "usr/local/share/ca-certificates" / crt.name)
    run(["chroot", str(rootfs), "update-ca-certificates"], stdout=subprocess.DEVNULL)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / junk).glob("*"):
            if f.is_file():
                f.unlink()
    tmp = BASE_TAR.with_suffix(".tmp")
    run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."])
    tmp.rename(BASE_TAR)
    shutil.rmtree(rootfs)
    return BASE_TAR


def import_base(d: Dockerd) -> None:
    if d.has_image(BASE_IMAGE):
        return
    with base_tarball().open("rb") as f:
        run(["docker", "import", "-", BASE_IMAGE], env=d.env, stdin=f, stdout=subprocess.DEVNULL)
    say(f"imported {BASE_IMAGE}")


def pip_build_args() -> list[str]:
    """Build args that let pip in a build reach the index this machine uses."""
    args: list[str] = []
    if EXTRA_CA.is_dir() and any(EXTRA_CA.glob("*.crt")):
        args += ["--build-arg", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        val = os.environ.get(var, "")
        urls = [u for u in val.split() if u.startswith(("http://", "https://"))]  # no file://
        if urls:
            args += ["--build-arg", f"{var}={' '.join(urls)}"]
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(var):
            args += ["--build-arg", f"{var}={os.environ[var]}"]
    return args


def build_images(d: Dockerd, tag: str) -> None:
    """The local stand-ins (python, redis, prometheus) and the dtq image on the python one."""
    local = ROOT / "deploy" / "docker" / "local"
    for target in ("python", "redis", "prometheus"):
        d.docker("build", "-q", "--network", "host", "-f", str(local / "Dockerfile"),
                 "--target", target, "-t", f"dtq-local-{target}:bookworm", str(local),
                 capture=True)  # fmt: skip
    d.docker("build", "-q", "--network", "host", "-f", str(ROOT / "deploy/docker/Dockerfile"),
             "--build-arg", "BASE_IMAGE=dtq-local-python:bookworm", *pip_build_args(),
             "-t", tag, str(ROOT), capture=True)  # fmt: skip
    say(f"built dtq-local-{{python,redis,prometheus}}:bookworm and {tag} (BASE_IMAGE=local)")
