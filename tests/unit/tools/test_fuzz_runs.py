"""``make fuzz`` resumes: a harness's results are kept under a key that changes exactly when
a file it exercises changes, and a run asks only what is left (tests/fuzz/runs.py,
tools/fuzz_report.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import runs

REPO = Path(__file__).resolve().parents[3]


class _Graph:
    """The part of grimp's graph ``exercised_files`` reads."""

    def __init__(self, imports: dict[str, set[str]]) -> None:
        self.imports = imports
        self.modules = set(imports)

    def find_upstream_modules(self, module: str) -> set[str]:
        found: set[str] = set()
        pending = [module]
        while pending:
            for name in self.imports.get(pending.pop(), set()) - found:
                found.add(name)
                pending.append(name)
        return found


def _tree(root: Path) -> _Graph:
    files = {
        "nodeagent/__init__.py": "",
        "nodeagent/parse/__init__.py": "from nodeagent import errors\n",
        "nodeagent/parse/text.py": "from nodeagent.parse import util\n",
        "nodeagent/parse/util.py": "X = 1\n",
        "nodeagent/errors.py": "class E(Exception): ...\n",
        "nodeagent/helped.py": "Y = 2\n",
        "nodeagent/daemon.py": "from nodeagent.parse import text\n",
        "tests/fuzz/conftest.py": "PROFILE = 'ci'\n",
        "tests/fuzz/helper.py": "from nodeagent import helped\n",
        "tests/fuzz/test_text.py": (
            "from nodeagent.parse.text import parse\nfrom tests.fuzz import helper\n"
        ),
        "tests/fuzz/test_other.py": "from nodeagent.errors import E\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return _Graph({
        "nodeagent": set(), "nodeagent.parse": {"nodeagent.errors"},
        "nodeagent.parse.text": {"nodeagent.parse.util"}, "nodeagent.parse.util": set(),
        "nodeagent.errors": set(), "nodeagent.helped": set(),
        "nodeagent.daemon": {"nodeagent.parse.text"},
    })  # fmt: skip


def _names(files: list[Path], root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in files)


def test_a_harness_exercises_its_imports_closed_over_the_graph_and_parent_packages(
    tmp_path: Path,
) -> None:
    graph = _tree(tmp_path)
    files = runs.exercised_files(tmp_path / "tests/fuzz/test_text.py", graph, tmp_path)
    assert _names(files, tmp_path) == [
        "nodeagent/__init__.py",
        "nodeagent/errors.py",
        "nodeagent/helped.py",
        "nodeagent/parse/__init__.py",
        "nodeagent/parse/text.py",
        "nodeagent/parse/util.py",
        "tests/fuzz/conftest.py",
        "tests/fuzz/helper.py",
        "tests/fuzz/test_text.py",
    ]  # fmt: skip  (not nodeagent/daemon.py, which imports the parser but is not imported)


def test_the_key_changes_with_an_exercised_module_only(tmp_path: Path) -> None:
    graph = _tree(tmp_path)

    def keys() -> dict[str, str]:
        found = {}
        for test in ("test_text", "test_other"):
            files = runs.exercised_files(tmp_path / f"tests/fuzz/{test}.py", graph, tmp_path)
            found[test] = runs.harness_key(f"tests/fuzz/{test}.py::t", files, tmp_path)
        return found

    before = keys()
    (tmp_path / "nodeagent/daemon.py").write_text("# changed\n")
    assert keys() == before
    (tmp_path / "nodeagent/parse/util.py").write_text("X = 2\n")
    after = keys()
    assert after["test_text"] != before["test_text"]
    assert after["test_other"] == before["test_other"]
    (tmp_path / "nodeagent/parse/util.py").write_text("X = 1\n")
    assert keys() == before  # the code changed back: its results count again


def test_results_resume_and_a_new_key_starts_from_zero(tmp_path: Path) -> None:
    store = runs.Store(tmp_path / "cache")
    first = store.load("t.py::a", "k1")
    assert runs.plan({"t.py::a": first}, 100) == {"t.py::a": 100}
    first.add(60, {"parse": 60}, 1.0)  # a run cut short by its wall-clock budget
    store.save(first)
    again = store.load("t.py::a", "k1")
    assert (again.inputs, again.reached) == (60, {"parse": 60})
    assert runs.plan({"t.py::a": again}, 100) == {"t.py::a": 40}
    again.add(40, {"parse": 40}, 1.0)
    store.save(again)
    assert runs.plan({"t.py::a": store.load("t.py::a", "k1")}, 100) == {}
    assert store.load("t.py::a", "k2").inputs == 0  # its code changed
    assert store.load("t.py::b", "k1").inputs == 0  # another harness, even on one key


def test_an_entry_point_reached_by_part_of_the_inputs_gets_a_top_up() -> None:
    deep = runs.Result("t.py::deep", "k", inputs=100, reached={"parse": 100, "check": 50})
    raw = runs.Result("t.py::raw", "k", inputs=100, reached={"parse": 100, "check": 1})
    asked = runs.plan({"t.py::deep": deep, "t.py::raw": raw}, 100)
    # check has 51 of 100; the deep harness reaches it in half its inputs: 49 / 0.5, +5 %, +10
    assert asked == {"t.py::deep": 113}
    rare = runs.Result("t.py::rare", "k", inputs=100, reached={"check": 1})
    assert runs.plan({"t.py::rare": rare}, 100) == {"t.py::rare": 200}  # capped, not 10,395
    unreached = runs.Result("t.py::new", "k", inputs=0)
    assert runs.plan({"t.py::new": unreached}, 100) == {"t.py::new": 100}


@pytest.mark.timeout(120)
def test_make_fuzz_twice_runs_only_what_is_left(tmp_path: Path) -> None:
    """The real tool on one cheap harness, budget 30: the second run has nothing left."""
    node_id = "tests/fuzz/test_node_identity.py::test_name_from_common_name"

    def make_fuzz() -> tuple[str, dict[str, object]]:
        env = os.environ | {"PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "tools/fuzz_report.py", "--budget", "30", "--jobs", "1",
             "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "report"),
             node_id],
            capture_output=True, text=True, cwd=REPO, env=env, check=False, timeout=110,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout, json.loads((tmp_path / "report" / "report.json").read_text())

    out, first = make_fuzz()
    assert "round 1: 1 harnesses, 30 inputs" in out
    out, second = make_fuzz()
    assert "round" not in out
    harness = second["harnesses"][node_id]  # type: ignore[index]
    assert harness == first["harnesses"][node_id]  # type: ignore[index]
    assert harness["inputs"] >= 30 and harness["runs"] == 1
    assert second["entry_points"]["identity.name_from_common_name"]["at_budget"]  # type: ignore[index]
