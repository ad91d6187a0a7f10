"""Every stick and site test beside a host's own udevd (``make beside-udevd``).

A systemd-booted machine runs systemd-udevd in the host's namespaces; this project's CI
machine runs none, so ``make test`` starts the tests' own. This runs the tests that use udev
the way a developer's laptop runs them: with a udevd in the host's namespaces that the tests
did not start (``node_udevd.HostUdevd``, a stand-in, unless this machine runs one), so the
single-node stick tests use that daemon ("the machine's own" in ``tests/testenv/udev.py``),
the site tests give the stick to a node with a udevd of that node's beside it
(``node_udevd.NodeUdevd``), and the e2e node gets the packaged rule through the host's
daemon (``node_udevd.host_rules``). Run as root::

    .venv/bin/python -m tests.testenv.beside_udevd [PYTEST_ARGS ...]

``MODULES`` lists the test modules; ``tests/unit/testenv/test_beside_udevd.py`` checks that
every test module using udev or the site's stick is in it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.testenv.node_udevd import HostUdevd
from tests.testenv.udev import udevd_answers

REPO = Path(__file__).resolve().parents[2]

MODULES: tuple[str, ...] = (
    "tests/e2e/test_container_unit.py",
    "tests/e2e/test_media.py",
    "tests/faults/test_media.py",
    "tests/faults/test_release_scale.py",
    "tests/faults/test_site.py",
    "tests/faults/test_site_disk.py",
    "tests/faults/test_site_yank.py",
    "tests/faults/test_store.py",
    "tests/integration/adapters/bundles/test_udev.py",
    "tests/integration/bench/test_scale_fanout.py",
    "tests/integration/bundles/test_corpus_runtime.py",
    "tests/integration/bundles/test_import_from_stick.py",
    "tests/integration/bundles/test_importer.py",
    "tests/integration/bundles/test_session_process.py",
    "tests/integration/bundles/test_walkthrough.py",
    "tests/integration/lifecycle/test_support_dump_stick.py",
    "tests/integration/testenv/test_demo.py",
    "tests/integration/testenv/test_site_beside_host_udevd.py",
    "tests/integration/testenv/test_site_fetch.py",
    "tests/integration/testenv/test_site_gate.py",
    "tests/integration/testenv/test_site_stick.py",
    "tests/security/test_crafted_stick.py",
)
"""The test modules that use a udev daemon: single-node sticks, the site's stick, e2e media."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = [sys.executable, "-m", "pytest", *MODULES, *args]
    if udevd_answers():
        print("beside_udevd: a udevd runs on this machine: the tests run beside it", flush=True)
        return subprocess.run(command, cwd=REPO, check=False).returncode
    with tempfile.TemporaryDirectory(prefix="beside-udevd-") as workdir, HostUdevd(Path(workdir)):
        print("beside_udevd: started a stand-in for a host's udevd", flush=True)
        return subprocess.run(command, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
