"""The RPM's distribution flavour (``--without bundled_deps``) requires exactly what
pyproject.toml's dependencies say, with their bounds (tools/rpm_requires.py; decision 0076),
and the command line's package (nodeagent-cli) is the one that requires them."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "packaging" / "nodeagent.spec"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rpm_requires", ROOT / "tools/rpm_requires.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rpm_requires = load_tool()


def test_the_spec_requires_what_pyproject_says() -> None:
    text = SPEC.read_text()
    assert rpm_requires.spec_block(text) == rpm_requires.block(), (
        "run: python tools/rpm_requires.py --write"
    )
    # in the command line's package (the node's requires it), in the flavour's branch
    cli = text.split("%package cli\n", 1)[1].split("%description cli", 1)[0]
    flavour = cli.split("%if %{with bundled_deps}\n", 1)[1].split("%endif", 1)[0]
    assert flavour.startswith("Requires:       nodeagent-bundled-deps = %{version}\n%else\n")
    assert flavour.split("%else\n", 1)[1] == rpm_requires.spec_block(text)


def test_every_dependency_is_required_with_its_bounds() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = rpm_requires.block().splitlines()[1:-1]
    assert len(lines) == len(dependencies)
    for dependency, line in zip(dependencies, lines, strict=True):
        name = rpm_requires.normalized(re.split(r"[<>=!~ ]", dependency, maxsplit=1)[0])
        assert f"dist({name}) >= " in line
        if "<" in dependency:
            assert line.startswith("Requires:       (") and " with " in line


@pytest.mark.parametrize(
    ("dependency", "line"),
    [
        ("h2>=4.1,<5", "Requires:       (python%{python3_pkgversion}dist(h2) >= 4.1 with "
         "python%{python3_pkgversion}dist(h2) < 5)"),
        ("PyYAML>=6.0", "Requires:       python%{python3_pkgversion}dist(pyyaml) >= 6.0"),
        ("prometheus_client>=0.20,<1", "Requires:       (python%{python3_pkgversion}dist("
         "prometheus-client) >= 0.20 with python%{python3_pkgversion}dist(prometheus-client) < 1)"),
    ],
)  # fmt: skip
def test_a_dependency_renders_as_fedora_names_it(dependency: str, line: str) -> None:
    assert rpm_requires.requirement(dependency) == line


@pytest.mark.parametrize("dependency", ["lightkube", "h2<5", "foo @ https://x.invalid/f.whl"])
def test_a_dependency_without_a_lower_bound_or_plain_form_is_refused(dependency: str) -> None:
    with pytest.raises(ValueError, match=r"lower bound|plain"):
        rpm_requires.requirement(dependency)


def section(text: str, header: str) -> str:
    """A package's preamble: from its header to its %description."""
    name = header.removeprefix("%package ").strip()
    body = text.split(header, 1)[1] if header else text.split("\n%description\n", 1)[0]
    return body.split(f"%description {name}", 1)[0] if header else body


def test_the_workstation_package_needs_no_runtime_and_enables_nothing() -> None:
    """nodeagent-cli: the command and the code, no cri-o, no unit, no scriptlet."""
    text = SPEC.read_text()
    cli = section(text, "%package cli\n")
    requires = [line for line in cli.splitlines() if line.startswith("Requires:")]
    assert requires and not [r for r in requires if "cri-o" in r or "systemd" in r]
    files = text.split("%files cli\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "%{_bindir}/nodeagent" in files and "%{appdir}/site-packages" in files
    assert not [f for f in files if "unit" in f or "preset" in f or "sysconfdir" in f]
    assert not re.search(r"^%(?:pre|post|preun|postun) cli\b", text, re.M)
    node = section(text, "")
    assert "Requires:       %{name}-cli = %{version}-%{release}\n" in node
    assert "Requires:       cri-o >= " in node
