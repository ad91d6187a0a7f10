"""End-to-end fixtures: nodeagent's own RPMs, installed in a Debian root booted under systemd.

``rpms`` builds the packages exactly as ``make rpm`` does (tools/build_rpm.py, %check
included). ``node`` unpacks the cached root file system, installs the RPMs with their
scriptlets, sets up CRI-O as crio.service and boots it with ``systemd-nspawn``
(tests/testenv/nspawn.py). The node shares this machine's network namespace, so the
session registry on 127.0.0.1 is its registry, and it sees this machine's udev: the host's
``/run/udev`` is bound in read-only and the tests' systemd-udevd runs nodeagent's rule
(docs/testing.md, "End-to-end under systemd").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.testenv.node import Node, make_node_root, node_options
from tests.testenv.node_udevd import host_rules
from tests.testenv.nspawn import Container
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry
from tests.testenv.rootfs import HOST_PACKAGES, rootfs_tarball
from tests.testenv.udev import Udevd

ROOT = Path(__file__).resolve().parents[2]
UDEV_RULE = ROOT / "systemd" / "90-nodeagent.rules"


def build_rpms(output: Path, *args: str) -> list[Path]:
    """tools/build_rpm.py into ``output``; the binary RPMs it wrote."""
    ensure_packages(HOST_PACKAGES)
    cmd = [sys.executable, str(ROOT / "tools" / "build_rpm.py"), "--output", str(output), *args]
    built = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    return [Path(line) for line in built.stdout.splitlines() if line.endswith(".rpm")]


FLAVOUR = os.environ.get("NODEAGENT_E2E_FLAVOUR", "bundled")
"""Which RPM flavour the e2e node runs (decision 0076): ``bundled`` (the default, with
nodeagent-bundled-deps) or ``distribution`` (built --without bundled_deps, with the test
system modules standing in for the distribution's: ``make e2e E2E_FLAVOUR=distribution``)."""
FLAVOUR_ARGS = {"bundled": (), "distribution": ("--without-bundled-deps", "--test-system-modules")}
MODULES_PACKAGE = {
    "bundled": "nodeagent-bundled-deps",
    "distribution": "nodeagent-test-system-modules",
}
MODULES_DIR = {
    "bundled": "/usr/lib/nodeagent/vendor",
    "distribution": "/usr/local/lib/python3.11/dist-packages",
}


@pytest.fixture(scope="session")
def rpms(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if FLAVOUR not in FLAVOUR_ARGS:
        raise pytest.UsageError(f"NODEAGENT_E2E_FLAVOUR={FLAVOUR!r}: bundled or distribution")
    return build_rpms(tmp_path_factory.mktemp("rpms"), *FLAVOUR_ARGS[FLAVOUR])


@pytest.fixture(scope="session")
def host_udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    """This machine's udev daemon with nodeagent's packaged rule: one the tests start where
    none runs, or a systemd host's own, which is given the rule for the run."""
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        if daemon.is_owned:
            daemon.add_rules(UDEV_RULE)
            yield daemon
        else:
            with host_rules(UDEV_RULE):
                yield daemon


@contextmanager
def booted_node(
    base: Path, rpms: Sequence[Path], registry: Registry, options: Sequence[str] = ()
) -> Iterator[Node]:
    rootfs_tarball()
    root = make_node_root(base, rpms, registry.host)
    container = Container(root, base / "nspawn", options=node_options(options))
    try:
        container.boot()
        node = Node(root, container)
        node.wait_active("crio.service", "nodeagent.service")
        yield node
    finally:
        container.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def node(
    tmp_path_factory: pytest.TempPathFactory,
    rpms: list[Path],
    registry: Registry,
    host_udevd: Udevd,
) -> Iterator[Node]:
    """One booted node for the tests that leave it running with nodeagent installed."""
    with booted_node(tmp_path_factory.mktemp("node"), rpms, registry, ["--bind-ro=/run/udev"]) as n:
        yield n
