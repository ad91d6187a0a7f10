"""The import contracts of pyproject.toml bite, and leave no module outside them.

Each probe copies ``nodeagent/`` and ``pyproject.toml`` to a temporary directory, adds one
forbidden import to the copy (or a new module), runs import-linter on the copy and expects it
to fail with exactly the contracts named. The unmodified copy must pass. A contract that no
longer fails on its probe has rotted: it names modules that moved, or checks nothing.

import-linter names an external package by its top-level name only, so the submodules it cannot
tell apart (``asyncio.subprocess`` inside asyncio, ``http.client``, ``urllib.request``) are
checked here by reading the imports and calls of every module.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import nodeagent
from tests.capabilities import skip_unless

skip_unless("dev-tools", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(nodeagent.__file__).resolve().parent
"""The package under test: the source tree, or the installed copy in the RPM's %check."""
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: dict[str, str] = {c["id"]: c["name"] for c in CONFIG["contracts"]}
LAYERS = next(c for c in CONFIG["contracts"] if c["id"] == "layers")

LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


@dataclass(frozen=True)
class Probe:
    """Lines added to files of the copy (created when missing) and the contracts that fail."""

    edits: dict[str, str]
    broken: frozenset[str]


PROBES: dict[str, Probe] = {
    "subprocess in a feature": Probe(
        {"nodeagent/cluster/tasks.py": "import subprocess"}, frozenset({"subprocess"})
    ),
    "Kubernetes client in a feature": Probe(
        {"nodeagent/bundles/manifest.py": "import lightkube"}, frozenset({"kubernetes"})
    ),
    "D-Bus in the udev adapter": Probe(
        {"nodeagent/adapters/bundles/udev.py": "import dbus_fast"}, frozenset({"dbus"})
    ),
    "an adapter reaches back into the daemon": Probe(
        {"nodeagent/adapters/cri/client.py": "import nodeagent.daemon"},
        frozenset({"adapters-never-reach-back"}),
    ),
    "an adapter reaches into the reporting publisher": Probe(
        {"nodeagent/adapters/files.py": "import nodeagent.reporting"},
        frozenset({"adapters-never-reach-back"}),
    ),
    "one feature imports another": Probe(
        {"nodeagent/bundles/manifest.py": "import nodeagent.cluster"}, frozenset({"layers"})
    ),
    "the store imports the bundle feature": Probe(
        {"nodeagent/store/keeping.py": "import nodeagent.bundles"}, frozenset({"layers"})
    ),
    "the store's pure rules open files through an adapter": Probe(
        {"nodeagent/store/layout.py": "import nodeagent.adapters.store.blobs"},
        frozenset({"adapters-only-from-root"}),
    ),
    "a file lock outside the store adapter": Probe(
        {"nodeagent/adapters/files.py": "import fcntl"}, frozenset({"fcntl"})
    ),
    "the store adapter speaks HTTP": Probe(
        {"nodeagent/adapters/store/copier.py": "import urllib.request"}, frozenset({"http"})
    ),
    "the pin path imports the CLI": Probe(
        {"nodeagent/pins/__init__.py": "import nodeagent.cli"},
        frozenset({"layers", "adapters-never-reach-back"}),  # adapters import the pin path
    ),
    "a new top-level module imports an adapter": Probe(
        {"nodeagent/newthing.py": "import nodeagent.adapters.files"},
        frozenset({"layers", "adapters-only-from-root"}),
    ),
    "a new module in a feature imports an adapter": Probe(
        {"nodeagent/bundles/newthing.py": "import nodeagent.adapters.files"},
        frozenset({"adapters-only-from-root"}),
    ),
    "a new top-level package without a layer": Probe(
        {"nodeagent/newfeature/__init__.py": '"""A feature."""'}, frozenset({"layers"})
    ),
    "udev outside the udev adapter": Probe(
        {"nodeagent/bundles/media.py": "import pyudev"}, frozenset({"udev"})
    ),
    "HTTP/2 outside the CRI transport": Probe(
        {"nodeagent/adapters/cri/client.py": "import h2.connection"}, frozenset({"http2"})
    ),
    "protobuf outside the CRI adapter": Probe(
        {"nodeagent/status.py": "import google.protobuf.message"}, frozenset({"protobuf"})
    ),
    "the generated CRI module outside the CRI adapter": Probe(
        {"nodeagent/daemon/root.py": "from nodeagent.adapters.cri.api import runtime_v1_pb2"},
        frozenset({"cri-api"}),
    ),
    "an HTTP client outside the registry adapter": Probe(
        {"nodeagent/registries/names.py": "import http.client"}, frozenset({"http"})
    ),
    "a future HTTP library in an adapter": Probe(
        {"nodeagent/adapters/kube.py": "import httpx"}, frozenset({"http"})
    ),
    "aiohttp outside the HTTP adapter": Probe(
        {"nodeagent/adapters/bundles/intake.py": "import aiohttp"}, frozenset({"aiohttp"})
    ),
    "aiohttp's URL type in a feature": Probe(
        {"nodeagent/site/__init__.py": "import yarl"}, frozenset({"aiohttp"})
    ),
    "prometheus_client outside the metrics adapter": Probe(
        {"nodeagent/metrics/recorder.py": "import prometheus_client"}, frozenset({"prometheus"})
    ),
    "grpcio": Probe({"nodeagent/adapters/cri/wire.py": "import grpc"}, frozenset({"grpc"})),
}


def copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "nodeagent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint_imports(copy: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the copy: its pyproject.toml (cwd), its package (PYTHONPATH), no cache."""
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "COLUMNS": "1000",  # one line per contract name, as the summary is read below
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def broken_contracts(output: str) -> set[str]:
    """The ids of the contracts that the summary reports BROKEN."""
    return {
        contract_id
        for contract_id, name in CONTRACTS.items()
        if re.search(rf"^{re.escape(name)} BROKEN\b", output, re.MULTILINE)
    }


def test_the_unmodified_package_keeps_every_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_package(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in output, output


@pytest.mark.parametrize("probe", PROBES.values(), ids=PROBES.keys())
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, probe: Probe) -> None:
    copy = copy_package(tmp_path)
    for relative, line in probe.edits.items():
        path = copy / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        before = path.read_text() if path.exists() else ""
        path.write_text(f"{before}\n{line}  # contract probe\n")

    result = lint_imports(copy)
    output = result.stdout + result.stderr

    assert result.returncode != 0, output
    assert broken_contracts(output) == probe.broken, output


# ---------------------------------------------------------------- every module has a layer


def modules_under(package: Path) -> Iterator[str]:
    """Every module and package below ``package`` (not the package itself), by dotted name."""
    root = package.parent
    for path in sorted(package.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            yield ".".join(path.relative_to(root).parts)
        elif path.suffix == ".py" and path.name != "__init__.py":
            yield ".".join(path.relative_to(root).with_suffix("").parts)


def layer_modules() -> set[str]:
    """The modules the layers contract names, optional ones included."""
    (container,) = LAYERS["containers"]
    names = set()
    for layer in LAYERS["layers"]:
        for tail in re.split(r"[|:]", layer):
            names.add(f"{container}.{tail.strip().strip('()')}")
    return names


def test_every_module_is_in_a_layer_or_an_adapter() -> None:
    layers = layer_modules()
    outside = [
        module
        for module in modules_under(PACKAGE)
        if not any(module == layer or module.startswith(f"{layer}.") for layer in layers)
        and not module.startswith("nodeagent.adapters")
    ]
    assert outside == [], f"give these a layer in pyproject.toml's layers contract: {outside}"


def test_the_layers_contract_covers_the_package_and_stays_exhaustive() -> None:
    assert LAYERS["containers"] == ["nodeagent"]
    assert LAYERS["exhaustive"] is True
    assert LAYERS["exhaustive_ignores"] == ["adapters"]
    assert "nodeagent.sync" in set(modules_under(PACKAGE))  # the walk finds modules at all


# ---------------------------------------------------------------- what import-linter cannot name

# An external package is one node for import-linter ("asyncio", "http", "urllib"); these are
# the submodules of such packages that do I/O, with the modules allowed to use them.
SUBMODULE_RULES: dict[str, tuple[str, ...]] = {
    # nobody starts processes but the OS image reader (bootc/rpm-ostree status, bounded),
    # the runtime's reload (its D-Bus child, adapters/systemd_bus.py) and a mirror session's
    # server when the daemon starts it itself ([bundles] session_socket = "", decision 0064)
    # and support-dump's journal excerpt (journalctl, bounded: decision 0072)
    "asyncio.subprocess": (
        "nodeagent.adapters.nodeos",
        "nodeagent.adapters.support_archive",
        "nodeagent.adapters.systemd",
        "nodeagent.adapters.bundles.session_server",
    ),
    "http.client": ("nodeagent.adapters.registry",),
    "urllib.request": ("nodeagent.adapters.registry",),
}
SUBPROCESS_CALLS = {"create_subprocess_exec", "create_subprocess_shell"}


def used_submodules(source: str) -> set[str]:
    """The I/O submodules of SUBMODULE_RULES that a module's source imports or calls into."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Attribute) and node.attr in SUBPROCESS_CALLS:
            names.add("asyncio.subprocess")
    names |= {"asyncio.subprocess" for n in names if n.rpartition(".")[2] in SUBPROCESS_CALLS}
    return {
        rule
        for rule in SUBMODULE_RULES
        for name in names
        if name == rule or name.startswith(f"{rule}.")
    }


@pytest.mark.parametrize(
    ("source", "used"),
    [
        ("import asyncio.subprocess", {"asyncio.subprocess"}),
        ("from asyncio import subprocess", {"asyncio.subprocess"}),
        ("from asyncio import create_subprocess_exec", {"asyncio.subprocess"}),
        ("import asyncio\nasyncio.create_subprocess_shell('x')", {"asyncio.subprocess"}),
        ("import http.client", {"http.client"}),
        ("from http import client", {"http.client"}),
        ("from http.client import HTTPConnection", {"http.client"}),
        ("import urllib.request", {"urllib.request"}),
        ("from urllib.parse import quote\nimport asyncio\nfrom http import HTTPStatus", set()),
    ],
)
def test_used_submodules_finds_every_spelling(source: str, used: set[str]) -> None:
    assert used_submodules(source) == used


def test_io_submodules_only_where_allowed() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        )
        for submodule in used_submodules(path.read_text()):
            allowed = SUBMODULE_RULES[submodule]
            if not any(module == a or module.startswith(f"{a}.") for a in allowed):
                offenders.append(f"{module} uses {submodule}")
    assert offenders == []
