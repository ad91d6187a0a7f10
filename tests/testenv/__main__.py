"""``python -m tests.testenv prepare``: Debian packages, CRI-O, kube-apiserver, kubectl and the
Debian root the end-to-end tests boot (all cached)."""

from __future__ import annotations

import argparse
import sys
import time

from tests.testenv.crio_build import CRIO, ensure_crio
from tests.testenv.kube_build import KUBE, ensure_kube
from tests.testenv.packages import ensure_packages
from tests.testenv.rootfs import HOST_PACKAGES, rootfs_tarball, tarball_path
from tests.testenv.udev import MEDIA_PACKAGES


def prepare() -> None:
    started = time.monotonic()
    installed = ensure_packages() + ensure_packages(MEDIA_PACKAGES)
    installed += ensure_packages(HOST_PACKAGES)
    if installed:
        print(f"testenv: installed Debian packages: {' '.join(installed)}")
    cached = CRIO.binary.exists()
    binary = ensure_crio()
    state = "cached" if cached else f"built in {time.monotonic() - started:.0f}s"
    print(f"testenv: CRI-O {CRIO.version} {state}: {binary}")
    started = time.monotonic()
    cached = KUBE.built
    bin_dir = ensure_kube()
    state = "cached" if cached else f"built in {time.monotonic() - started:.0f}s"
    print(f"testenv: kube-apiserver and kubectl {KUBE.version} {state}: {bin_dir}")
    cached = tarball_path().exists()
    started = time.monotonic()
    tarball = rootfs_tarball()
    state = "cached" if cached else f"made in {time.monotonic() - started:.0f}s"
    print(f"testenv: nspawn root {state}: {tarball}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv")
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    prepare()
    return 0


if __name__ == "__main__":
    sys.exit(main())
