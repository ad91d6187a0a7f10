"""Run the fuzz harnesses (tests/fuzz) until every entry point has had its budget of inputs,
resuming from earlier runs, and report what is proved (``make fuzz``).

    python tools/fuzz_report.py [--budget N] [--budget-s S] [--jobs J] [--cache-dir DIR]
                                [--report-dir DIR] [--rounds R] [--report-only] [--pending]
                                [PATH_OR_NODE_ID ...]

Each harness is keyed by a hash of its test module, the test helpers and the nodeagent
modules it exercises (tests/fuzz/runs.py); its inputs and the inputs that reached each entry
point accumulate under that key in ``--cache-dir`` (``~/.cache/nodeagent-fuzz`` by default,
never in the repository). A run asks each harness only what is left: ``--budget`` inputs of
its own (100,000 by default), then top-ups for any entry point reached fewer than
``--budget`` times (up to ``--rounds`` rounds). Each harness runs in its own pytest process
with hypothesis' ``fuzz`` profile, stopped after ``--budget-s`` seconds of wall clock (its
count kept: the next run goes on from there); ``--jobs`` run side by side.

The report (inputs per entry point and per harness, the keys, the commit) is printed and
written to ``--report-dir`` (build/fuzz/report.json and report.md). Exit status: 1 when a
harness's last run failed (its log is in the report directory), 2 when none failed but a
harness or an entry point is short of ``--budget`` for its current key, 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz import runs  # noqa: E402  (the repository root is put on the path above)


@dataclass
class Outcome:
    """One harness's pytest process: its status and what it ran."""

    node_id: str
    asked: int
    status: str = "not run"
    seconds: float = 0.0
    inputs: int = 0
    reached: dict[str, int] = field(default_factory=dict)
    log: str = ""


def harnesses(paths: list[str], *, is_pending: bool) -> list[str]:
    """The node ids of the harnesses ``paths`` name (node ids are taken as they are)."""
    if paths and all("::" in path for path in paths):
        return paths
    marks = ["-m", "not drill_long"] if is_pending else []
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *marks, *(paths or ["tests/fuzz"])],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"collecting the harnesses failed:\n{result.stdout[-3000:]}{result.stderr}")
    return [line for line in result.stdout.splitlines() if "::" in line]


def keyed_results(node_ids: list[str], store: runs.Store) -> dict[str, runs.Result]:
    """Each harness's results for its current key (new and empty when its code changed)."""
    graph = runs.nodeagent_graph()
    per_file: dict[str, list[Path]] = {}
    results: dict[str, runs.Result] = {}
    for node_id in node_ids:
        test_file = node_id.split("::", 1)[0]
        if test_file not in per_file:
            per_file[test_file] = runs.exercised_files(ROOT / test_file, graph)
        files = per_file[test_file]
        key = runs.harness_key(node_id, files)
        results[node_id] = store.load(node_id, key, [str(f.relative_to(ROOT)) for f in files])
    return results


def key_now(node_id: str) -> str:
    """The harness's key from the files as they are now."""
    test_file = ROOT / node_id.split("::", 1)[0]
    return runs.harness_key(node_id, runs.exercised_files(test_file, runs.nodeagent_graph()))


def run_one(node_id: str, asked: int, args: argparse.Namespace) -> Outcome:
    outcome = Outcome(node_id, asked)
    with tempfile.TemporaryDirectory(prefix="fuzz-counts-") as scratch:
        counts = Path(scratch) / "counts.json"
        env = os.environ | {
            "NODEAGENT_FUZZ_PROFILE": "fuzz",
            "NODEAGENT_FUZZ_EXAMPLES": str(asked),
            "NODEAGENT_FUZZ_BUDGET_S": str(args.budget_s),
            "NODEAGENT_FUZZ_COUNTS": str(counts),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        marks = ["-m", "not drill_long"] if args.pending else []
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
             f"--timeout={int(args.budget_s * 2 + 300)}", *marks, node_id],
            capture_output=True, text=True, check=False, cwd=ROOT, env=env,
        )  # fmt: skip
        outcome.seconds = time.monotonic() - started
        if counts.exists():
            doc = json.loads(counts.read_text())
            outcome.inputs = int(doc["inputs"])
            outcome.reached = {k: int(v["inputs"]) for k, v in doc["entries"].items()}
    if result.returncode == 0:
        outcome.status = "budget_s ran out" if "fuzz budget" in result.stdout else "ok"
    else:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        log = args.report_dir / (node_id.replace("/", "_").replace("::", "__") + ".log")
        log.write_text(result.stdout + result.stderr)
        outcome.status, outcome.log = "FAILED", str(log)
    return outcome


def record(result: runs.Result, outcome: Outcome, commit: str) -> None:
    """Add a run to a harness's results: a failed run's inputs prove nothing and are dropped."""
    if outcome.status == "FAILED":
        result.failure = outcome.log
    else:
        result.failure = ""
        result.add(outcome.inputs, outcome.reached, outcome.seconds)
    result.runs.append({
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": commit,
        "asked": outcome.asked, "inputs": outcome.inputs, "seconds": round(outcome.seconds, 1),
        "status": outcome.status,
    })  # fmt: skip


def fuzz(results: dict[str, runs.Result], store: runs.Store, args: argparse.Namespace) -> None:
    """Up to ``--rounds`` rounds, each asking every harness what ``runs.plan`` says it owes."""
    commit = current_commit()
    for number in range(1, args.rounds + 1):
        asked = runs.plan(results, args.budget)
        if not asked:
            return
        print(f"round {number}: {len(asked)} harnesses, {sum(asked.values())} inputs", flush=True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(
                lambda item: run_and_keep(results[item[0]], item[1], store, args, commit),
                sorted(asked.items()),
            ))  # fmt: skip
        if all(outcome.status == "FAILED" or outcome.inputs == 0 for outcome in done):
            return  # nothing moved: another round would not either


def run_and_keep(
    result: runs.Result, asked: int, store: runs.Store, args: argparse.Namespace, commit: str
) -> Outcome:
    """Run one harness for ``asked`` inputs and store what it did at once (a run cut short
    later loses nothing already done)."""
    outcome = run_one(result.node_id, asked, args)
    if key_now(result.node_id) != result.key:  # edited while it ran: what ran is not known
        outcome.status, outcome.inputs = "code changed during the run: not counted", 0
        print(f"  {result.node_id}: {outcome.status}", flush=True)
        return outcome
    record(result, outcome, commit)
    store.save(result)
    print(
        f"  {result.node_id}: {outcome.status}, {outcome.inputs} of {asked} inputs "
        f"in {outcome.seconds:.0f} s",
        flush=True,
    )
    return outcome


def current_commit() -> str:
    """HEAD, with ``-dirty`` when tracked files differ from it."""

    def git(*argv: str) -> str:
        found = subprocess.run(
            ["git", *argv], capture_output=True, text=True, cwd=ROOT, check=False
        )
        return found.stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def report(results: dict[str, runs.Result], budget: int, scope: list[str]) -> dict[str, Any]:
    entries: dict[str, dict[str, Any]] = {}
    for node_id, result in sorted(results.items()):
        for entry, count in result.reached.items():
            row = entries.setdefault(entry, {"inputs": 0, "harnesses": {}})
            row["inputs"] += count
            row["harnesses"][node_id] = {"key": result.key, "inputs": count}
    for row in entries.values():
        row["at_budget"] = row["inputs"] >= budget
    harness_rows = {
        node_id: {
            "key": r.key, "inputs": r.inputs, "at_budget": r.inputs >= budget,
            "seconds": round(r.seconds, 1), "runs": len(r.runs), "failure": r.failure,
            "files": r.files,
        }
        for node_id, r in sorted(results.items())
    }  # fmt: skip
    return {
        "commit": current_commit(),
        "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "budget": budget,
        "scope": scope or ["tests/fuzz"],
        "entry_points": dict(sorted(entries.items())),
        "harnesses": harness_rows,
        "complete": all(r["at_budget"] for r in entries.values())
        and all(h["at_budget"] and not h["failure"] for h in harness_rows.values()),
    }


def markdown(doc: dict[str, Any]) -> str:
    budget = doc["budget"]
    scope = ", ".join(doc["scope"])
    if doc["scope"] != ["tests/fuzz"]:
        scope += " (not every harness)"
    lines = [
        f"# make fuzz report ({doc['written']})", "",
        f"Commit `{doc['commit']}`; budget {budget:,} inputs per entry point and per harness; "
        f"{'complete' if doc['complete'] else 'PARTIAL'}; scope {scope}.",
        "",
        "| entry point | inputs | at budget | harnesses (key) |", "| --- | ---: | --- | --- |",
    ]  # fmt: skip
    for entry, row in doc["entry_points"].items():
        keys = ", ".join(
            f"{node_id.split('::')[-1]} ({h['key'][:12]})"
            for node_id, h in row["harnesses"].items()
        )
        verdict = "yes" if row["at_budget"] else "no (partial)"
        lines.append(f"| `{entry}` | {row['inputs']:,} | {verdict} | {keys} |")
    lines += ["", "| harness | key | inputs | at budget | runs | last run |",
              "| --- | --- | ---: | --- | ---: | --- |"]  # fmt: skip
    for node_id, row in doc["harnesses"].items():
        verdict = "yes" if row["at_budget"] else "no (partial)"
        last = f"FAILED, log {row['failure']}" if row["failure"] else "ok"
        lines.append(
            f"| `{node_id}` | `{row['key'][:12]}` | {row['inputs']:,} | {verdict} "
            f"| {row['runs']} | {last} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="test files or node ids (default: tests/fuzz)")
    parser.add_argument("--budget", type=int, default=100_000, help="inputs per entry point")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="per harness and run")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="top-up rounds at most")
    parser.add_argument("--cache-dir", type=Path, default=runs.default_cache_dir())
    parser.add_argument("--report-dir", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--report-only", action="store_true", help="run nothing, report")
    parser.add_argument("--pending", action="store_true", help="add the fuzz_pending harnesses")
    args = parser.parse_args()
    args.report_dir = args.report_dir.resolve()
    store = runs.Store(args.cache_dir)
    results = keyed_results(harnesses(args.paths, is_pending=args.pending), store)
    print(
        f"{len(results)} harnesses, budget {args.budget} inputs, {args.budget_s:g} s per "
        f"harness and run, {args.jobs} at a time, results in {args.cache_dir}",
        flush=True,
    )
    if not args.report_only:
        fuzz(results, store, args)
    doc = report(results, args.budget, args.paths)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.report_dir / "report.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"report: {args.report_dir / 'report.md'} and report.json")
    if any(h["failure"] for h in doc["harnesses"].values()):
        return 1
    return 0 if doc["complete"] else 2


if __name__ == "__main__":
    sys.exit(main())
