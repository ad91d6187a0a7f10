"""``python -m tests.testenv prepare``: Debian packages, CRI-O, kube-apiserver, kubectl and the
Debian root the end-to-end tests boot (all cached).

Each part is a step that prints what it does when it starts and its elapsed time when it
ends (``tests/testenv/steps.py``): a first run builds for minutes and says so as it goes; a
second run finds everything under ``~/.cache/nodeagent-testenv/`` and takes about a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.testenv.crio_build import CACHE_ROOT, CRIO, ensure_crio
from tests.testenv.kube_build import KUBE, ensure_kube
from tests.testenv.packages import ensure_packages, missing_packages
from tests.testenv.rootfs import HOST_PACKAGES, rootfs_tarball, tarball_path
from tests.testenv.steps import Say, Steps, say_now
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


def _cached_or(is_cached: bool, work: str) -> str:
    return f"cached under {CACHE_ROOT}, reused" if is_cached else work


def prepare(*, nspawn_root: bool = True, with_kube: bool = True, say: Say = say_now) -> Steps:
    """Install, build and make what the tests' real peers need, one printed step each:
    ``nspawn_root`` for tests/e2e, ``with_kube`` for the cluster tests (``make demo`` needs
    neither). Returns the steps with their timings."""
    steps = Steps(say, prefix="testenv: ")
    wanted = [None, MEDIA_PACKAGES, *([HOST_PACKAGES] if nspawn_root else [])]
    todo = sorted({name for w in wanted for name in missing_packages(w)})
    with steps.step("Debian packages (registry, conmon, crun, skopeo, udev, mkfs ...)"):
        steps.note(f"installing with apt-get: {' '.join(todo)}" if todo else "all installed")
        for w in wanted:
            ensure_packages(w)
    with steps.step(f"CRI-O {CRIO.version} (go build of the pinned module)"):
        steps.note(_cached_or(CRIO.binary.exists(), "building: a few minutes the first time"))
        _where(steps, ensure_crio())
    if with_kube:
        with steps.step(f"kube-apiserver, etcd and kubectl {KUBE.version} (the cluster tests)"):
            steps.note(_cached_or(KUBE.built, "building: several minutes the first time"))
            _where(steps, ensure_kube())
    if nspawn_root:
        with steps.step("the Debian root file system the end-to-end tests boot (debootstrap)"):
            steps.note(_cached_or(tarball_path().exists(), "debootstrap: about 2 minutes"))
            _where(steps, rootfs_tarball())
    say(f"testenv: prepared in {steps.total():.1f} s")
    return steps


def _where(steps: Steps, path: Path) -> None:
    steps.note(f"at {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv")
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    prepare()
    return 0


if __name__ == "__main__":
    sys.exit(main())
