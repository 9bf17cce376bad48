"""Installing the Debian tools some tests need (prometheus, chromium), once per session.

CI runs as root on a fresh machine: the tests install what they need themselves, or skip with
the reason when that is not possible (not root, no network, no package).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

_updated = False


def ensure_apt(binary: str, package: str) -> str:
    """Path of ``binary``, installing Debian ``package`` if needed; pytest.skip when it can't."""
    global _updated
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"{binary} missing and apt-get needs root: install Debian package {package}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        if not _updated:
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600,
                           capture_output=True)  # fmt: skip
            _updated = True
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
            check=True, env=env, timeout=900, capture_output=True,
        )  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        out = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"could not install {package} with apt-get: {exc} {out[-300:]!r}")
    found = shutil.which(binary)
    if not found:
        pytest.skip(f"{package} installed but {binary} is not on PATH")
    return found
