"""What ``make fuzz`` has proved so far: per harness, the inputs run and the inputs that reached
each entry point, kept from run to run for as long as the code they ran on is unchanged.

A harness's *key* hashes the bytes of its test module, of the test helpers it imports
(``tests.fuzz.strategies``, ``tests.fuzz.contract``, the fuzz ``conftest``), of every
nodeagent module it exercises, and hypothesis' version. The nodeagent modules are the ones the
test module imports, closed over the import graph of ``nodeagent`` (grimp, as import-linter
reads it), each module's parent packages included (their ``__init__`` runs on import). A
module imported only at run time (``importlib``) is not seen; none of the fuzzed parsers does.

The results of a harness live in one JSON file per key under the cache directory
(``~/.cache/nodeagent-fuzz`` unless told otherwise): a change to any of those files gives the
harness a new key and it starts from zero; changing the code back finds the old results again.
``plan`` says how many inputs each harness still owes: ``budget`` inputs of its own, then, for
an entry point short of ``budget`` reached inputs, more inputs of the harness that reaches it
most often (a deep entry point behind a parser is reached by a part of the inputs only).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import grimp
import hypothesis

ROOT: Final = Path(__file__).resolve().parents[2]
FUZZ_HELPERS: Final = ("tests/fuzz/conftest.py",)
"""Files every harness depends on although it does not import them (the hypothesis profiles)."""
TOP_UP_MARGIN: Final = 1.05
"""A top-up asks 5 % more than the reach rate predicts, and at least ``TOP_UP_MIN`` (or 1 % of
the budget) more, so that one top-up nearly always suffices (the rate varies from run to run)."""
TOP_UP_MIN: Final = 10
TOP_UP_MAX: Final = 2
"""A top-up asks at most this many budgets of inputs in one round: an entry point that its best
harness reaches rarely needs a harness whose inputs reach it, not hours of the one it has."""


def default_cache_dir() -> Path:
    """``$NODEAGENT_FUZZ_CACHE``, else ``$XDG_CACHE_HOME/nodeagent-fuzz`` (``~/.cache``)."""
    explicit = os.environ.get("NODEAGENT_FUZZ_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodeagent-fuzz"


# ---------------------------------------------------------------- what a harness exercises
def imported_modules(source: str) -> set[str]:
    """Every module name ``source`` imports, and ``package.name`` for ``from package import name``
    (``name`` may be a module; the caller keeps the names that are files)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of module ``name`` under ``root``, or None (not ours, or not a module)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(names: Iterable[str]) -> set[str]:
    result: set[str] = set()
    for name in names:
        parts = name.split(".")
        result.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return result


def exercised_files(test_file: Path, graph: Any, root: Path = ROOT) -> list[Path]:
    """The files a harness in ``test_file`` runs: itself, the test helpers it imports (and
    theirs), the fuzz helpers, and the nodeagent modules they import, closed over ``graph``."""
    files: set[Path] = {test_file, *(root / helper for helper in FUZZ_HELPERS)}
    ours: set[str] = set()
    pending = [test_file]
    while pending:  # the tests.* modules, through their own imports
        current = pending.pop()
        for name in imported_modules(current.read_text()):
            path = module_file(name, root)
            if path is None:
                continue
            if name.split(".")[0] == "nodeagent":
                ours.add(name)
            elif path not in files:
                files.add(path)
                pending.append(path)
    closed: set[str] = set()
    frontier = _with_parents(ours)
    while frontier - closed:  # imports, and the packages whose __init__ each import runs
        name = (frontier - closed).pop()
        closed.add(name)
        if name in graph.modules:
            frontier |= _with_parents(graph.find_upstream_modules(name))
    files.update(p for p in (module_file(n, root) for n in closed) if p is not None)
    return sorted(files)


def nodeagent_graph() -> Any:
    """The import graph of ``nodeagent`` (grimp)."""
    return grimp.build_graph("nodeagent", cache_dir=None)


def harness_key(node_id: str, files: Iterable[Path], root: Path = ROOT) -> str:
    """sha256 over the harness's id, hypothesis' version and each file's path and bytes."""
    digest = hashlib.sha256(f"{node_id}\0hypothesis {hypothesis.__version__}\0".encode())
    for path in sorted(files):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# ---------------------------------------------------------------- results kept across runs
@dataclass
class Result:
    """A harness's accumulated results for one key."""

    node_id: str
    key: str
    files: list[str] = field(default_factory=list)
    inputs: int = 0
    """Inputs the harness ran (hypothesis examples, its explicit ``@example``s included)."""
    reached: dict[str, int] = field(default_factory=dict)
    """Per entry point, the inputs that reached it."""
    seconds: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    """One line per run: when, commit, inputs asked and run, status."""
    failure: str = ""
    """The log of the last run when it failed (its inputs are not counted), else empty."""

    def add(self, inputs: int, reached: Mapping[str, int], seconds: float) -> None:
        self.inputs += inputs
        for entry, count in reached.items():
            self.reached[entry] = self.reached.get(entry, 0) + count
        self.seconds += seconds


class Store:
    """One JSON file per harness key under ``directory`` (written atomically)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, node_id: str, key: str, files: Iterable[str] = ()) -> Result:
        path = self._path(key)
        if path.is_file():
            doc = json.loads(path.read_text())
            if doc.get("node_id") == node_id and doc.get("key") == key:
                return Result(**doc)
        return Result(node_id, key, sorted(files))

    def save(self, result: Result) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(result.key)
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(asdict(result), indent=1, sort_keys=True) + "\n")
        scratch.replace(path)


# ---------------------------------------------------------------- what is left to do
def totals(results: Iterable[Result]) -> dict[str, int]:
    """Reached inputs per entry point, over every harness."""
    summed: dict[str, int] = {}
    for result in results:
        for entry, count in result.reached.items():
            summed[entry] = summed.get(entry, 0) + count
    return summed


def own_share(result: Result, budget: int) -> int:
    """Inputs ``result``'s harness still owes of its own ``budget``."""
    return max(0, budget - result.inputs)


def plan(results: Mapping[str, Result], budget: int) -> dict[str, int]:
    """Inputs to ask of each harness (by node id) now: what it owes of its own budget, and for
    each entry point that would stay short of ``budget`` after that, the inputs that the
    harness reaching it most often needs to close the gap at its reach rate so far. An entry
    point no input has reached yet gets nothing (its harness must run before a rate exists)."""
    asked = {node_id: own_share(result, budget) for node_id, result in results.items()}
    projected: dict[str, float] = {}
    for node_id, result in results.items():
        for entry, count in result.reached.items():
            rate = count / result.inputs if result.inputs else 0.0
            projected[entry] = projected.get(entry, 0.0) + count + rate * asked[node_id]
    for entry in sorted(projected):
        expected = projected[entry]
        if expected >= budget:
            continue
        best = _best_reacher(results, entry)
        if best is None:
            continue
        node_id, rate = best
        needed = math.ceil((budget - expected) / rate * TOP_UP_MARGIN)
        extra = min(needed + max(TOP_UP_MIN, budget // 100), TOP_UP_MAX * budget)
        asked[node_id] += extra
        for other, count in results[node_id].reached.items():
            projected[other] = projected.get(other, 0.0) + extra * count / results[node_id].inputs
    return {node_id: n for node_id, n in asked.items() if n > 0}


def _best_reacher(results: Mapping[str, Result], entry: str) -> tuple[str, float] | None:
    rates = [
        (result.reached[entry] / result.inputs, node_id)
        for node_id, result in results.items()
        if result.inputs and result.reached.get(entry)
    ]
    if not rates:
        return None
    rate, node_id = max(rates)
    return node_id, rate
