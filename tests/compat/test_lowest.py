"""The fast part of ``make compat`` inside ``make test`` (issue 29 item 4): the service and
HTTP suites on Python 3.11 with every runtime dependency at the lower bound pyproject
states (aiohttp 3.9.0 and the rest: ``tests/testenv/compat.py``, which prints the versions). The
HTTP suite is the one an older aiohttp breaks: the peer server and the mirror override
aiohttp's server hooks and subclass asyncio's ``SSLProtocol``. ``make compat`` also runs the
unit suite there and both suites on Debian 13's Python 3.13. About 60 s here once the
virtualenv is cached (30 s more the first time).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.testenv.compat import REPO, lowest_constraints, lowest_venv, versions

SUITES = (
    "tests/service",
    "tests/integration/adapters/http",
    "tests/integration/adapters/test_metrics_endpoint.py",
)


@pytest.mark.timeout(600)
def test_the_service_and_http_suites_pass_at_the_lowest_bounds() -> None:
    venv = lowest_venv()
    python = str(venv / "bin" / "python")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    used = versions([python], env)
    for pin in lowest_constraints():  # the run really is at the bounds
        name, _, version = pin.partition("==")
        assert f"{name} {version}" in used, (pin, used)
    assert "Python 3.11." in used
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    tail = done.stdout[-3000:]
    assert done.returncode == 0, f"{used}\n{tail}\n{done.stderr[-2000:]}"
    assert " passed" in tail and " skipped" not in tail.split("\n")[-2], tail
