"""``make test`` collects every test module under tests/: moving a folder never drops tests.

A fresh pytest collects with the repository's own configuration and no path arguments,
as ``make test`` runs it (``testpaths``, ``norecursedirs``, ``python_files``); every
``test_*.py`` below tests/ must show up with at least one test, and the harness
(tests/testenv) and the stand-ins (tests/fakes) must hold none.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


@pytest.fixture(scope="module")
def collected_files() -> set[Path]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=50,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    node_ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert node_ids, result.stdout[-4000:]
    return {(REPO / node_id.split("::", 1)[0]).resolve() for node_id in node_ids}


def test_every_test_module_is_collected(collected_files: set[Path]) -> None:
    on_disk = {path.resolve() for path in TESTS.rglob("test_*.py")}
    left_out = sorted(str(path.relative_to(REPO)) for path in on_disk - collected_files)
    assert not left_out, f"make test does not collect {left_out}"
    assert collected_files <= on_disk  # and nothing from outside tests/


def test_the_harness_and_the_stand_ins_hold_no_tests() -> None:
    for folder in ("testenv", "fakes"):
        assert sorted((TESTS / folder).rglob("test_*.py")) == []
        assert sorted((TESTS / folder).rglob("*_test.py")) == []


def test_every_tests_folder_is_a_package() -> None:
    # Test modules of one name in two folders (unit/adapters/cri/test_client.py,
    # integration/adapters/cri/test_client.py) import only as parts of packages.
    folders = {path.parent for path in TESTS.rglob("*.py")}
    missing = [f for f in folders if not (f / "__init__.py").exists()]
    assert sorted(str(f.relative_to(REPO)) for f in missing) == []
