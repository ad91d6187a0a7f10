"""The peers the tests start write containers/image's blob-info cache into the session's own
``/var/lib/containers`` (a tmpfs, ``tests/testenv/host_view.py``), never the host's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pushed
from tests.testenv.host_view import CONTAINERS_DIR, is_private, own_containers_dir
from tests.testenv.packages import ensure_packages

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CACHE = CONTAINERS_DIR / "cache" / "blob-info-cache-v1.boltdb"
"""Debian 12's skopeo (containers/image 5.23) keeps its cache in BoltDB; CRI-O's, SQLite."""


def host_stat(view: Any, path: Path) -> str:
    """``stat`` of ``path`` as the host sees it (size and modification time), or ``absent``."""
    done = subprocess.run(
        [*view.host_prefix(), "stat", "--format=%s %Y.%y", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "absent"


def test_a_pull_writes_its_cache_in_the_session_view_and_not_the_host_s(
    host_view: Any, registry: Any, pushed: Pushed, tmp_path: Path
) -> None:
    assert host_view is not None, "make test runs as root"
    assert is_private()
    ensure_packages({"skopeo": "/usr/bin/skopeo"})
    before = host_stat(host_view, CACHE)
    CACHE.unlink(missing_ok=True)
    subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", f"docker://{pushed.ref(pushed.base_a)}",
         f"oci:{tmp_path / 'layout'}:a"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert CACHE.stat().st_size > 0  # skopeo wrote its cache: into the session's tmpfs
    assert host_stat(host_view, CACHE) == before


def test_a_benchmark_started_from_the_host_s_view_gets_its_own(
    host_view: Any, tmp_path: Path
) -> None:
    """``own_containers_dir`` (every benchmark's ``main``): a process started in the host's
    mount namespace writes into a tmpfs of its own, which is gone, and the host's directory
    as it was, once it ends; inside a view of its own already, it changes nothing."""
    assert host_view is not None, "make test runs as root"
    marker = CONTAINERS_DIR / "nodeagent-bench-marker"
    child = (
        "from pathlib import Path\n"
        "from tests.testenv.host_view import own_containers_dir, is_private\n"
        "with own_containers_dir():\n"
        f"    Path({str(marker)!r}).write_text('x')\n"
        "    print(is_private())\n"
    )
    before = host_stat(host_view, CONTAINERS_DIR)
    done = subprocess.run(
        [*host_view.host_prefix(), sys.executable, "-c", child],
        capture_output=True, text=True, check=False, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
    assert host_stat(host_view, marker) == "absent"
    assert host_stat(host_view, CONTAINERS_DIR) == before
    with own_containers_dir():  # this session's view already: nothing unshared or mounted
        assert is_private()
    assert is_private()
