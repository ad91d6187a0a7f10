"""The attack tests of docs/security.md: each performs one attack against the real component.

Every test in this folder is marked ``security`` (below); those that take long (a flood held
for its full duration, a fan-out timed against its baseline) are ``security_long`` as well.
``make security`` runs them all; ``make test`` runs the others, the bounded sample (its
addopts deselect ``security_long``). One module per attacker's move, named after it, with the
attack in its docstring and the figure it measures, if any, printed and asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.security)
