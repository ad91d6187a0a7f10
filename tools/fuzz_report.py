"""Run every fuzz harness (tests/fuzz) with the large profile and report inputs per entry point.

    python tools/fuzz_report.py [--examples N] [--budget-s S] [--jobs J] [--target N]
                                [--pending] [--json FILE] [PATH_OR_NODE_ID ...]

Each harness runs in its own pytest process with hypothesis' ``fuzz`` profile
(tests/fuzz/conftest.py): ``--examples`` inputs (100,000 by default) or, whichever comes
first, ``--budget-s`` seconds of wall clock (then it is skipped, its count kept). ``--jobs``
harnesses run side by side. The counts come from tests/fuzz/contract.py, per entry point
(two harnesses, raw and structured, often share one): inputs, wall-clock seconds of the
harnesses (generating inputs included), inputs per second overall and inside the calls.
``--pending`` adds the harnesses marked ``fuzz_pending`` (a crash fixed on another branch).
Logs of failing harnesses go to build/fuzz/.

Exit status: 1 when a harness failed (a crash, a stall or an unclipped message), 2 when
none failed but an entry point ran fewer than ``--target`` inputs, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "fuzz"


@dataclass
class Run:
    """One harness's pytest process: its outcome and the inputs per entry point."""

    node_id: str
    status: str = "not run"
    seconds: float = 0.0
    counts: dict[str, dict[str, float]] = field(default_factory=dict)


def harnesses(paths: list[str], *, is_pending: bool) -> list[str]:
    marks = [] if not is_pending else ["-m", "not drill_long"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *marks, *(paths or ["tests/fuzz"])],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"collecting the harnesses failed:\n{result.stdout[-3000:]}{result.stderr}")
    return [line for line in result.stdout.splitlines() if "::" in line]


def run_one(node_id: str, args: argparse.Namespace) -> Run:
    run = Run(node_id)
    with tempfile.TemporaryDirectory(prefix="fuzz-counts-") as scratch:
        counts = Path(scratch) / "counts.json"
        env = os.environ | {
            "NODEAGENT_FUZZ_PROFILE": "fuzz",
            "NODEAGENT_FUZZ_EXAMPLES": str(args.examples),
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
        run.seconds = time.monotonic() - started
        if counts.exists():
            run.counts = json.loads(counts.read_text())
    run.status = _status(result)
    if run.status == "FAILED":
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / (node_id.replace("/", "_").replace("::", "__") + ".log")
        log.write_text(result.stdout + result.stderr)
        run.status = f"FAILED (log: {log.relative_to(ROOT)})"
    return run


def _status(result: subprocess.CompletedProcess[str]) -> str:
    if result.returncode == 0:
        return "budget ran out" if "fuzz budget" in result.stdout else "ok"
    return "FAILED"


def report(runs: list[Run], target: int) -> tuple[list[str], dict[str, dict[str, float]]]:
    totals: dict[str, dict[str, float]] = {}
    for run in runs:
        for entry, figures in run.counts.items():
            total = totals.setdefault(entry, {"inputs": 0, "seconds": 0.0, "wall_s": 0.0})
            total["inputs"] += figures["inputs"]
            total["seconds"] += figures["seconds"]
            total["wall_s"] += run.seconds
    lines = [
        f"{'entry point':44} {'inputs':>8} {'wall s':>7} {'inputs/s':>8} {'in calls/s':>10}"
        "  verdict"
    ]
    for entry, total in sorted(totals.items()):
        rate = total["inputs"] / total["wall_s"] if total["wall_s"] else 0.0
        call_rate = total["inputs"] / total["seconds"] if total["seconds"] else 0.0
        verdict = "ok" if total["inputs"] >= target else f"short of {target}"
        lines.append(
            f"{entry:44} {int(total['inputs']):>8} {total['wall_s']:>7.0f} {rate:>8.0f} "
            f"{call_rate:>10.0f}  {verdict}"
        )
    lines.append("")
    lines.extend(f"{run.node_id}: {run.status} in {run.seconds:.0f} s" for run in runs)
    return lines, totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="test files or node ids (default: tests/fuzz)")
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--budget-s", type=float, default=3600.0, help="per harness")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--target", type=int, default=100_000, help="inputs per entry point")
    parser.add_argument("--pending", action="store_true", help="add the fuzz_pending harnesses")
    parser.add_argument("--json", type=Path, help="write the totals here as well")
    args = parser.parse_args()
    node_ids = harnesses(args.paths, is_pending=args.pending)
    print(f"{len(node_ids)} harnesses, {args.examples} inputs or {args.budget_s:g} s each, "
          f"{args.jobs} at a time", flush=True)  # fmt: skip
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(lambda node_id: _announce(run_one(node_id, args)), node_ids))
    lines, totals = report(runs, args.target)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(totals, indent=1, sort_keys=True) + "\n")
    if any(run.status.startswith("FAILED") for run in runs):
        return 1
    return 2 if any(total["inputs"] < args.target for total in totals.values()) else 0


def _announce(run: Run) -> Run:
    inputs = sum(int(figures["inputs"]) for figures in run.counts.values())
    print(f"  {run.node_id}: {run.status}, {inputs} inputs in {run.seconds:.0f} s", flush=True)
    return run


if __name__ == "__main__":
    sys.exit(main())
