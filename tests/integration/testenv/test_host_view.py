"""The peers the tests start write containers/image's blob-info cache into the session's own
``/var/lib/containers`` (a tmpfs, ``tests/testenv/host_view.py``), never the host's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pushed
from tests.testenv.host_view import CONTAINERS_DIR, is_private
from tests.testenv.packages import ensure_packages

pytestmark = pytest.mark.integration

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
