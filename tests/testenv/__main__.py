"""``python -m tests.testenv prepare``: Debian packages, CRI-O, kube-apiserver, kubectl and the
Debian root the end-to-end tests boot (all cached)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from tests.testenv.crio_build import CRIO, ensure_crio
from tests.testenv.kube_build import KUBE, ensure_kube
from tests.testenv.packages import ensure_packages, missing_packages
from tests.testenv.rootfs import HOST_PACKAGES, rootfs_tarball, tarball_path
from tests.testenv.udev import MEDIA_PACKAGES


def missing(*, nspawn_root: bool = True) -> list[str]:
    """What ``prepare`` would install, build or make: nothing once everything is cached."""
    packages = missing_packages() + missing_packages(MEDIA_PACKAGES)
    if nspawn_root:
        packages += missing_packages(HOST_PACKAGES)
    found = [f"Debian packages {' '.join(sorted(set(packages)))}"] if packages else []
    found += [] if CRIO.binary.exists() else [f"CRI-O {CRIO.version}"]
    found += [] if KUBE.built else [f"kube-apiserver {KUBE.version}"]
    if nspawn_root and not tarball_path().exists():
        found.append("the nspawn root")
    return found


def prepare(*, nspawn_root: bool = True, say: Callable[[str], None] = print) -> None:
    """Install, build and make what the tests' real peers need; ``nspawn_root`` for tests/e2e."""
    started = time.monotonic()
    installed = ensure_packages() + ensure_packages(MEDIA_PACKAGES)
    if nspawn_root:
        installed += ensure_packages(HOST_PACKAGES)
    if installed:
        say(f"testenv: installed Debian packages: {' '.join(installed)}")
    cached = CRIO.binary.exists()
    binary = ensure_crio()
    state = "cached" if cached else f"built in {time.monotonic() - started:.0f}s"
    say(f"testenv: CRI-O {CRIO.version} {state}: {binary}")
    started = time.monotonic()
    cached = KUBE.built
    bin_dir = ensure_kube()
    state = "cached" if cached else f"built in {time.monotonic() - started:.0f}s"
    say(f"testenv: kube-apiserver and kubectl {KUBE.version} {state}: {bin_dir}")
    if not nspawn_root:
        return
    cached = tarball_path().exists()
    started = time.monotonic()
    tarball = rootfs_tarball()
    state = "cached" if cached else f"made in {time.monotonic() - started:.0f}s"
    say(f"testenv: nspawn root {state}: {tarball}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv")
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    prepare()
    return 0


if __name__ == "__main__":
    sys.exit(main())
