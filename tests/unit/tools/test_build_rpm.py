"""tools/build_rpm.py asks rpmbuild for the interpreter the target needs: the launcher names
``/usr/bin/python%{python3_pkgversion}``, so ``--python3-pkgversion 3.11`` (RHEL 9) gives
python3.11 and the python3.11 package names together; ``--node-python`` overrides the
launcher alone (decision 0076)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "packaging" / "nodeagent.spec"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_rpm", ROOT / "tools" / "build_rpm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_rpm = load_tool()


def defines(*argv: str) -> dict[str, str]:
    cmd = build_rpm.rpmbuild_command(SPEC, Path("/top"), build_rpm.parse_args(list(argv)))
    pairs = [cmd[i + 1].split(" ", 1) for i, arg in enumerate(cmd) if arg == "--define"]
    return {name: value for name, value in pairs}


def expanded(text: str, found: dict[str, str]) -> str:
    """``text`` as rpm expands it with the spec's fallback for python3_pkgversion."""
    version = found.get("python3_pkgversion", "3")
    cmd = ["rpm", "--define", f"python3_pkgversion {version}", "--eval", text]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        ((), "/usr/bin/python3"),
        (("--python3-pkgversion", "3.11"), "/usr/bin/python3.11"),
        (("--python3-pkgversion", "3.12"), "/usr/bin/python3.12"),
        (("--python3-pkgversion", "3.11", "--node-python", "/opt/py3"), "/opt/py3"),
    ],
)  # fmt: skip
@pytest.mark.needs("rpm")
def test_the_launcher_names_the_targets_interpreter(argv: tuple[str, ...], launcher: str) -> None:
    found = defines(*argv)
    assert expanded(found["nodeagent_python"], found) == launcher
    if "--python3-pkgversion" in argv:
        assert found["python3_pkgversion"] in {"3.11", "3.12"}
    else:
        assert "python3_pkgversion" not in found  # the spec's own fallback, 3


def test_the_spec_names_packages_and_launcher_from_the_same_define() -> None:
    spec = SPEC.read_text()
    assert "#!%{nodeagent_python} -I\n" in spec
    assert "Requires:       %{nodeagent_python}\n" in spec
    assert "BuildRequires:  python%{python3_pkgversion}-devel\n" in spec


def test_the_flavour_switch_reaches_rpmbuild() -> None:
    cmd = build_rpm.rpmbuild_command(
        SPEC, Path("/top"), build_rpm.parse_args(["--without-bundled-deps"])
    )
    assert cmd[cmd.index("--without") + 1] == "bundled_deps"
    assert "--without" not in build_rpm.rpmbuild_command(
        SPEC, Path("/top"), build_rpm.parse_args([])
    )
