"""No error is swallowed in ``nodeagent/`` (issue 30, "no error swallowed").

A ``contextlib.suppress`` names the exact exceptions it expects, never ``Exception`` or
``BaseException``; a handler of ``Exception``, ``BaseException`` or everything either
raises again, logs an event with a reason code (a ``reason=`` field), or hands the error
on and says so on its line (``# noqa: BLE001`` followed by where it goes). The walk is of
the source tree itself, so a new module is covered the day it is added.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nodeagent

PACKAGE = Path(nodeagent.__file__).resolve().parent
"""The package under test: the source tree, or the installed copy in the RPM's %check."""
BROAD = frozenset({"Exception", "BaseException"})


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"BaseException"}  # a bare except
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return {item.id for item in items if isinstance(item, ast.Name)}


def _is_suppress(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "suppress"


def _accounts_for(handler: ast.ExceptHandler, line: str) -> bool:
    for node in ast.walk(handler):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and any(k.arg == "reason" for k in node.keywords):
            return True
    marker = line.partition("# noqa:")[2]
    return "BLE001" in marker and len(marker.split("BLE001", 1)[1].strip(" ,()")) > 8


def violations(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_suppress(node):
            broad = {a.id for a in node.args if isinstance(a, ast.Name)} & BROAD
            if broad:
                found.append(f"{where}:{node.lineno}: suppress({', '.join(sorted(broad))})")
        if isinstance(node, ast.ExceptHandler) and _names(node.type) & BROAD:
            line = lines[node.lineno - 1]
            if not _accounts_for(node, line):
                found.append(f"{where}:{node.lineno}: {line.strip()}")
    return found


def test_no_module_swallows_an_error() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ("import contextlib\nwith contextlib.suppress(Exception):\n    pass\n", 1),
        ("from contextlib import suppress\nwith suppress(OSError, BaseException):\n    pass\n", 1),
        ("with suppress(OSError):\n    pass\n", 0),
        ("try:\n    f()\nexcept Exception:\n    pass\n", 1),
        ("try:\n    f()\nexcept:\n    pass\n", 1),
        ("try:\n    f()\nexcept (OSError, BaseException):\n    g()\n", 1),
        ("try:\n    f()\nexcept BaseException:\n    undo()\n    raise\n", 0),
        ("try:\n    f()\nexcept Exception as e:\n    log.error('x', reason='R')\n", 0),
        ("try:\n    f()\nexcept Exception as e:  # noqa: BLE001\n    keep(e)\n", 1),
        (
            "try:\n    f()\nexcept Exception as e:  # noqa: BLE001  (handed to the caller)\n"
            "    keep(e)\n",
            0,
        ),
        ("try:\n    f()\nexcept OSError:\n    pass\n", 0),
    ],
)
def test_the_rule_itself(source: str, count: int) -> None:
    assert len(violations(source, "m.py")) == count
