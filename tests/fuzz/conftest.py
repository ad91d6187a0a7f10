"""Hypothesis profiles for tests/fuzz, and the per-entry-point counts ``make fuzz`` reads.

``NODEAGENT_FUZZ_PROFILE`` picks the profile: ``ci`` (the default, ``make test``: 100
inputs per harness, the whole folder in under a minute) or ``fuzz`` (``make fuzz``:
``NODEAGENT_FUZZ_EXAMPLES`` inputs per harness, 100,000 by default, each harness within
``NODEAGENT_FUZZ_BUDGET_S``). Neither keeps an example database: a failing input is
printed, and kept as an ``@example`` in its harness. With ``NODEAGENT_FUZZ_COUNTS`` set
(tools/fuzz_report.py), the inputs the harnesses ran (every call of a test body, its
``@example``s included), the inputs that reached each entry point and the seconds spent in
the calls are written there as JSON.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz.contract import COUNTS, SECONDS

_INPUTS: list[int] = [0]

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under make fuzz, count each input a harness runs: hypothesis calls
    ``test.hypothesis.inner_test`` once per input (the hook it offers plugins)."""
    if not os.environ.get("NODEAGENT_FUZZ_COUNTS"):
        return
    for item in items:
        handle = getattr(getattr(item, "obj", None), "hypothesis", None)
        if handle is not None and not getattr(handle.inner_test, "counted", False):
            handle.inner_test = _counted(handle.inner_test)


def _counted(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _INPUTS[0] += 1
        return inner(*args, **kwargs)

    counted.counted = True  # type: ignore[attr-defined]
    return counted


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("NODEAGENT_FUZZ_COUNTS")
    if target:
        doc = {
            "inputs": _INPUTS[0],
            "entries": {
                entry: {"inputs": COUNTS[entry], "seconds": SECONDS.get(entry, 0.0)}
                for entry in COUNTS
            },
        }
        Path(target).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
