"""Debian packages the test environment needs, installed on demand (idempotent, quiet)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

_MULTIARCH = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"

# Package name -> a binary it provides (checked first: cheap and exact).
PACKAGES: dict[str, str] = {
    "docker-registry": "/usr/bin/docker-registry",
    "conmon": "/usr/bin/conmon",
    "crun": "/usr/bin/crun",
    "runc": "/usr/bin/runc",  # the runtime of the tests that run pods (tests/testenv/pods.py)
    "skopeo": "/usr/bin/skopeo",
    "podman": "/usr/bin/podman",  # CRI-O storage as the MCD reads it; pulls via the node mirror
    "umoci": "/usr/bin/umoci",
    "minisign": "/usr/bin/minisign",
    "e2fsprogs": "/usr/sbin/mkfs.ext4",
    "util-linux": "/usr/bin/mount",
    "apache2-utils": "/usr/bin/htpasswd",  # bcrypt htpasswd files for registry basic auth
    "openssl": "/usr/bin/openssl",  # self-signed certificates: registry TLS, token signing
    "dbus": "/usr/bin/dbus-daemon",  # a private bus for the systemd adapter's tests
    "etcd-server": "/usr/bin/etcd",  # storage of the test kube-apiserver (tests/testenv/kube.py)
    "iproute2": "/usr/sbin/ip",  # network namespaces and TUN links with latency (link.py)
    "prometheus": "/usr/bin/promtool",  # checks deploy/monitoring's PrometheusRule (promtool)
    # one daemon's wall clock stepped, never the host's (tests/testenv/faketime.py)
    "libfaketime": f"/usr/lib/{_MULTIARCH}/faketime/libfaketimeMT.so.1",
}


def missing_packages(wanted: dict[str, str] | None = None) -> list[str]:
    """The packages of ``wanted`` whose marker binary is not installed."""
    return [name for name, binary in (wanted or PACKAGES).items() if not Path(binary).exists()]


def ensure_packages(wanted: dict[str, str] | None = None) -> list[str]:
    """Install the missing packages with apt-get; return what was installed."""
    missing = missing_packages(wanted)
    if not missing:
        return []
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"cannot install {missing}: apt-get not found (Debian or Ubuntu needed)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lists = Path("/var/lib/apt/lists")
    if not any(entry.name.endswith("_Packages") for entry in lists.iterdir()):
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        # A stale package list is the usual cause: refresh once and retry.
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return missing
