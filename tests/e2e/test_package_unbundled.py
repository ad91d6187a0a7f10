"""The flavour built ``--without bundled_deps`` (decision 0076): nodeagent with the
distribution's Python modules. The e2e node is Debian 12, whose own modules are too old,
so the "distribution" modules are nodeagent-test-system-modules: the same locked wheels,
installed where a system's modules go and providing ``python3dist(NAME) = VERSION``
(TEST ONLY, labelled so; tests/testenv/nodeagent-test-system-modules.spec).

Proven here: rpm finds every generated Python Requires met by those provides (only what
Debian's dpkg holds is left unmet), and the package runs: the daemon starts from the
system modules (no /usr/lib/nodeagent/vendor), pins a set and reports its FIPS posture.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Pushed
from tests.e2e.conftest import booted_node, build_rpms
from tests.testenv.agent import set_state
from tests.testenv.node import DB_PATH, Node
from tests.testenv.registry import Registry

SET = "e2e-unbundled"
SYSTEM_SITE = "/usr/local/lib/python3.11/dist-packages"
DPKG_HELD = {"/bin/sh", "/usr/bin/python3", "python(abi) >= 3.11", "cri-o >= 1.29.4"}


@pytest.fixture(scope="module")
def unbundled_rpms(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    built = build_rpms(
        tmp_path_factory.mktemp("unbundled"),
        "--nocheck",  # %check of this flavour: checked by hand, decision 0076
        "--without-bundled-deps",
        "--test-system-modules",
    )
    assert sorted(p.name.split("-0.1.0")[0] for p in built) == [
        "nodeagent",
        "nodeagent-cli",
        "nodeagent-test-system-modules",
    ]
    return built


@pytest.fixture(scope="module")
def unbundled_node(
    tmp_path_factory: pytest.TempPathFactory,
    unbundled_rpms: list[Path],
    registry: Registry,
    pushed: Pushed,
) -> Iterator[Node]:
    with booted_node(tmp_path_factory.mktemp("unbundled-node"), unbundled_rpms, registry) as n:
        n.write_set(SET, [pushed.ref(pushed.base_a)])
        yield n


def rpm(node: Node, *args: str, check: bool = True) -> str:
    result = node.container.run("rpm", f"--dbpath={DB_PATH}", *args, check=check)
    return result.stdout + result.stderr


def test_every_python_requirement_is_met_by_the_system_modules(
    unbundled_node: Node, unbundled_rpms: list[Path]
) -> None:
    node = unbundled_node
    components = [p for p in unbundled_rpms if "system-modules" not in p.name]
    for component in components:
        (node.root / "var/tmp" / component.name).write_bytes(component.read_bytes())
    requires = rpm(node, "-q", "--requires", "nodeagent-cli")
    assert "(python3dist(aiohttp) >= 3.9 with python3dist(aiohttp) < 4)" in requires
    assert "nodeagent-bundled-deps" not in requires + rpm(node, "-q", "--requires", "nodeagent")
    # A dependency check of the same packages again: what rpm cannot find among the installed
    # packages' provides. Debian's python3, sh and the bound-in cri-o are not in rpm's database.
    paths = [f"/var/tmp/{p.name}" for p in components]
    checked = rpm(node, "-U", "--test", "--replacepkgs", *paths, check=False)
    unmet = set(re.findall(r"^\s+(.+?) is needed by ", checked, re.M))
    assert unmet <= DPKG_HELD, unmet
    provides = rpm(node, "-q", "--provides", "nodeagent-test-system-modules")
    assert "python3dist(protobuf) = " in provides


def test_the_daemon_runs_from_the_system_modules_and_pins(
    unbundled_node: Node, pushed: Pushed
) -> None:
    node = unbundled_node
    assert not (node.root / "usr/lib/nodeagent/vendor").exists()
    code = (
        "import sys; sys.path[:0] = ['/usr/lib/nodeagent/site-packages']; "
        "import aiohttp, google.protobuf, nodeagent.daemon.root; print(aiohttp.__file__)"
    )
    where = node.container.run("python3", "-I", "-c", code).stdout.strip()
    assert where.startswith(f"{SYSTEM_SITE}/aiohttp/"), where
    status = node.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned")
    # this machine's kernel has no FIPS switch: unknown, and the backend is not loaded
    assert status["crypto"] == {
        "hostFips": None, "backend": "not loaded", "backendFips": None, "ed25519": "not-checked",
    }  # fmt: skip
    shown = node.container.run("nodeagent", "check-config").stdout
    assert "Ed25519 verifies with cryptography" in shown
