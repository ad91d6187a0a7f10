"""Hypothesis profiles for tests/fuzz, and the per-entry-point counts ``make fuzz`` reads.

``NODEAGENT_FUZZ_PROFILE`` picks the profile: ``ci`` (the default, ``make test``: 100
inputs per harness, the whole folder in under a minute) or ``fuzz`` (``make fuzz``:
``NODEAGENT_FUZZ_EXAMPLES`` inputs per harness, 100,000 by default, each harness within
``NODEAGENT_FUZZ_BUDGET_S``). Neither keeps an example database: a failing input is
printed, and kept as an ``@example`` in its harness. With ``NODEAGENT_FUZZ_COUNTS`` set,
the inputs run per entry point and the seconds they took are written there as JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz.contract import COUNTS, SECONDS

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("NODEAGENT_FUZZ_EXAMPLES", "100")),
    deadline=None,  # contract.CPU_BOUND_S bounds CPU time; wall time varies on a busy machine
    database=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("NODEAGENT_FUZZ_EXAMPLES", "100000")),
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[*_SUPPRESSED, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("NODEAGENT_FUZZ_PROFILE", "ci"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("NODEAGENT_FUZZ_COUNTS")
    if target and COUNTS:
        doc = {entry: {"inputs": COUNTS[entry], "seconds": SECONDS[entry]} for entry in COUNTS}
        Path(target).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
