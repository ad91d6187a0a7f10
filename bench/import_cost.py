"""What cluster mode's modules cost at rest: VmRSS after each step of its imports.

Issue 29 item 3 asks what lightkube, its HTTP client (the httpx2/httpcore2 fork) and the
models cost, before choosing how to bring cluster mode's idle RSS to the 50 MiB goal. Each
row runs a fresh interpreter of the node's runtime (the bundled wheels only, byte-compiled,
the unit's malloc settings: ``tests/integration/pins/test_idle_memory.runtime_python``) that
imports every step up to that row, collects garbage and reads its VmRSS. The first row is the
baseline measured in the same run: the modules the reference daemon loads
(``nodeagent.daemon.wiring``). Each row prints its VmRSS, the step's own cost and the ratio
to the baseline; ``--repeat`` takes the median::

    .venv/bin/python -m bench.import_cost              # ~10 s
    .venv/bin/python -m bench.import_cost --repeat 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.integration.pins.test_idle_memory import runtime_python

STEPS: tuple[tuple[str, str], ...] = (
    ("the reference daemon's modules", "import nodeagent.daemon.wiring"),
    ("ssl: a default context (system CAs)", "import ssl; _ctx = ssl.create_default_context()"),
    ("importlib.metadata (httpcore2 reads its version)", "import importlib.metadata"),
    ("httpcore2 (lightkube's HTTP core)", "import httpcore2"),
    ("httpx2 (lightkube's HTTP client)", "import httpx2"),
    ("lightkube: client and generic resources", "import lightkube, lightkube.generic_resource"),
    ("lightkube: the core/v1 and coordination models", "import lightkube.resources.core_v1, "
     "lightkube.resources.coordination_v1"),
    ("nodeagent.adapters.kube", "import nodeagent.adapters.kube"),
    ("nodeagent.daemon.cluster (the rest of cluster mode)", "import nodeagent.daemon.cluster"),
)  # fmt: skip

PROBE = """
import gc
{imports}
gc.collect()
for line in open('/proc/self/status'):
    if line.startswith('VmRSS:'):
        print(line.split()[1])
"""


def rss_kib(python: str, upto: int) -> int:
    imports = "\n".join(code for _, code in STEPS[: upto + 1])
    done = subprocess.run(
        [python, "-c", PROBE.format(imports=imports)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="import-cost-") as work:
        python = runtime_python(Path(work))
        kibs = [
            int(statistics.median(rss_kib(python, n) for _ in range(max(args.repeat, 1))))
            for n in range(len(STEPS))
        ]
    base = kibs[0]
    rows = [
        {"step": what, "rssKiB": kib, "stepKiB": kib - (kibs[n - 1] if n else 0),
         "ratio": round(kib / base, 3)}
        for n, ((what, _), kib) in enumerate(zip(STEPS, kibs, strict=True))
    ]  # fmt: skip
    if args.json:
        json.dump({"baselineKiB": base, "rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(f"{'VmRSS':>10} {'step':>9} {'ratio':>6}  after importing")
    for n, ((what, _), kib) in enumerate(zip(STEPS, kibs, strict=True)):
        step = kib - (kibs[n - 1] if n else 0)
        print(f"{kib / 1024:7.1f} MiB {step / 1024:+6.1f} MiB {kib / base:5.2f}x  {what}")
    print(f"cluster mode's modules add {(kibs[-1] - base) / 1024:.1f} MiB to the reference "
          f"daemon's {base / 1024:.1f} MiB ({kibs[-1] / base:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
