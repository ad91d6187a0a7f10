"""``make beside-udevd`` covers every test module that uses a udev daemon or the site's stick."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.testenv.beside_udevd import MODULES

TESTS = Path(__file__).resolve().parents[2]
DAEMON_USERS: dict[str, set[str] | None] = {
    "tests.testenv.udev": {"Udevd", "settle", "udev_properties"},
    "tests.testenv.node_udevd": None,  # any name
    "tests.testenv.site_stick": {"stick_site", "stick_site_udevd"},
    "tests.testenv.site_node": {"stick_udevd"},
    "tests.testenv.demo.__main__": None,
    "tests.faults.test_site": {"three_nodes"},
    "bench.scale_fanout": {"fanout_step"},  # node 0's stick udevd (bench/fanout.py)
}
"""Module -> the names whose import means a test runs a udev daemon (None: every name)."""


def runs_udevd(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in DAEMON_USERS:
            names = DAEMON_USERS[node.module]
            if names is None or names & {alias.name for alias in node.names}:
                return True
    return False


def using_udev() -> set[str]:
    return {
        str(path.relative_to(TESTS.parent))
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] != "testenv" and runs_udevd(path.read_text())
    }


def test_every_module_using_udev_runs_beside_a_host_udevd() -> None:
    found = using_udev()
    assert "tests/integration/testenv/test_site_stick.py" in found  # the rules still match
    assert found - set(MODULES) == set()


def test_every_listed_module_exists_and_uses_udev() -> None:
    assert set(MODULES) - using_udev() == set()
