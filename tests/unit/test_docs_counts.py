"""The test counts the documents state are what pytest collects (issue 30 item 6).

A line of docs/ that names exactly one test module (`` `tests/....py` ``) and states a count
of its cases (``N cases``, ``N + M cases``, ``N tests``) must state what pytest collects
from that module today: a test added or removed changes the figure, and this test says
which line to update. Counts that no module backs (a suite's whole run, a dated
measurement) are not matched: they carry their date and command instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.capabilities import skip_unless

skip_unless("dev-tools", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
_MODULE = re.compile(r"`(tests/[A-Za-z0-9_/]+\.py)`")
_COUNT = re.compile(r"\b(\d+(?: \+ \d+)*) (?:cases|tests)\b")


@dataclass(frozen=True)
class Claim:
    doc: str
    line: int
    module: str
    count: int


def claims() -> list[Claim]:
    found = []
    for doc in sorted((ROOT / "docs").rglob("*.md")):
        for number, text in enumerate(doc.read_text().splitlines(), start=1):
            modules = set(_MODULE.findall(text))
            counts = _COUNT.findall(text)
            if len(modules) == 1 and len(counts) == 1:
                total = sum(int(part) for part in counts[0].split(" + "))
                found.append(Claim(doc.relative_to(ROOT).as_posix(), number, modules.pop(), total))
    return found


def collected(modules: list[str]) -> Counter[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", *modules],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return Counter(line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line)


CLAIMS = claims()


def test_the_documents_state_counts_of_some_modules() -> None:
    """The matcher still finds the stated counts (a rewording would hide them all)."""
    assert len(CLAIMS) >= 3, CLAIMS


def test_every_stated_count_is_what_pytest_collects() -> None:
    counts = collected(sorted({c.module for c in CLAIMS}))
    wrong = [
        f"{c.doc}:{c.line}: {c.module} states {c.count}, pytest collects {counts[c.module]}"
        for c in CLAIMS
        if counts[c.module] != c.count
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("| `tests/a/test_x.py` | what | 95 cases, about 6 s |", 95),
        ("`tests/b.py` (5 + 3 cases)", 8),
        ("`tests/c.py` and `tests/d.py`: 4 cases", None),
    ],
)
def test_a_claim_is_one_module_and_one_count(text: str, expected: int | None) -> None:
    modules = set(_MODULE.findall(text))
    counts = _COUNT.findall(text)
    got = (
        sum(int(p) for p in counts[0].split(" + "))
        if len(modules) == 1 and len(counts) == 1
        else None
    )
    assert got == expected
