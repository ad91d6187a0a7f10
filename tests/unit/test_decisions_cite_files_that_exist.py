"""Every decision record names files and modules that exist: a path of the repository
(``nodeagent/...``, ``tests/...``, ``docs/...``, ``tools/...``, ...), a glob that matches
something, or a dotted ``nodeagent.`` module (one attribute after it allowed). nodeagent's
own files are looked up in the package under test (the RPM's %check has no nodeagent/ in
its copy of the tree)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nodeagent

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(nodeagent.__file__).resolve().parent
DECISIONS = sorted((ROOT / "docs" / "decisions").glob("*.md"))
TOP = ("nodeagent", "tests", "docs", "tools", "packaging", "systemd", "deploy", "bench", ".ci")
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(re.escape(t) for t in TOP)})/[\w./*{{}}@-]*[\w*}}])")
MODULE = re.compile(r"(?<![\w/.-])(nodeagent(?:\.[a-z_][a-z0-9_]*)+)(?![\w-])")
NOT_MODULES = (".io", ".com", ".org", ".service", ".socket", ".path", ".target", ".timer")
"""An API group or a domain (nodeagent.io), a systemd unit (nodeagent.service)."""


def located(path: str) -> Path:
    if path == "nodeagent" or path.startswith("nodeagent/"):
        return PACKAGE.parent / path
    return ROOT / path


def exists(path: str) -> bool:
    if any(c in path for c in "*{}"):
        pattern = re.sub(r"\{[^}]*\}", "*", path)
        target = located(pattern)
        return any(target.parent.glob(target.name)) if "*" in target.name else target.exists()
    return located(path).exists()


def module_exists(dotted: str) -> bool:
    """A module or package, or one name its source defines or imports."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = PACKAGE.parent.joinpath(*parts[:end])
        source = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if source.is_file():
            if end == len(parts):
                return True
            name = parts[end]
            return (
                end == len(parts) - 1 and re.search(rf"\b{name}\b", source.read_text()) is not None
            )
    return False


def missing(text: str) -> list[str]:
    paths = [p for p in PATH.findall(text) if not exists(p.rstrip("."))]
    modules = [
        m for m in MODULE.findall(text) if not m.endswith(NOT_MODULES) and not module_exists(m)
    ]
    return paths + modules


@pytest.mark.parametrize("decision", DECISIONS, ids=lambda p: p.name[:4])
def test_every_cited_file_exists(decision: Path) -> None:
    assert missing(decision.read_text()) == []


def test_the_check_finds_a_file_that_moved() -> None:
    """The paths decision 0004 named before its files moved are reported, the new ones not."""
    old = "`nodeagent/adapters/grpc_h2.py`, nodeagent.adapters.grpc_wire, tools/nothing.py"
    assert missing(old) == [
        "nodeagent/adapters/grpc_h2.py",
        "tools/nothing.py",
        "nodeagent.adapters.grpc_wire",
    ]
    assert missing("`nodeagent/adapters/cri/h2.py`, nodeagent.adapters.cri.wire.frame") == []
    assert missing("docs/decisions/0058-*.md and deploy/crds/*.yaml") == []
