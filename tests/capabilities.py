"""Capability probes: a test skips only because a probe says the machine lacks something.

A skip is a decision, not an accident (issue 30). Each capability a test may need is a
probe here: a function that returns ``None`` when the machine has it, or a sentence saying
what is missing. A test that needs one says so with ``@pytest.mark.needs("name")`` (the
test skips before it starts, with the probe's sentence) or, where only the attempt tells,
``skip_for("name", detail)``. Every skip carries its probe's name (``[probe name]``).

At the end of a run (tests/conftest.py, ``ProbeReport``) every probe is printed with its
verdict, and every skipped test with its probe; the run FAILS when

* a test skipped without naming a probe (an accidental skip);
* a test skipped for a probe that says the capability is there;
* a probe is absent that tests/expected-skips.toml does not allow on this machine kind.

``python -m tests.capabilities`` prints the probes and the machine kind.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

TESTS = Path(__file__).resolve().parent
MANIFEST = TESTS / "expected-skips.toml"
TAG = re.compile(r"\[probe ([a-z0-9-]+)\]")


def _root() -> str | None:
    return None if os.geteuid() == 0 else "not root: losetup, mount(2) and netns need it"


def _blkio() -> str | None:
    from tests.testenv import blkio

    return blkio.missing()


def _site_net() -> str | None:
    from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork

    network = SiteNetwork(1)
    try:
        network.start()
    except SiteNetUnavailable as exc:
        return str(exc)
    finally:
        network.stop()
    return None


def _netem() -> str | None:
    if (missing := _site_net()) is not None:
        return missing
    from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork

    network = SiteNetwork(2, delay_ms=1)
    try:
        network.start()
    except SiteNetUnavailable as exc:
        return str(exc)
    finally:
        network.stop()
    return None


def _own_udevd() -> str | None:
    from tests.testenv.udev import foreign_udevd_answers

    if foreign_udevd_answers():
        return "a udev daemon the tests did not start is running (its rules are not ours)"
    return None


def _pty() -> str | None:
    try:
        master, slave = os.openpty()
    except OSError as exc:
        return f"no pseudo-terminal: {exc}"
    os.close(master)
    os.close(slave)
    return None


def _pods() -> str | None:
    from tests.testenv import pods

    return pods.missing()


def _tool(name: str, package: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        return None if shutil.which(name) else f"{name} is not on PATH (Debian package {package})"

    return probe


DEV_TOOLS = ("import-linter", "mypy", "ruff")


def _unbudgeted() -> str | None:
    budget = os.environ.get("NODEAGENT_FUZZ_BUDGET_S", "")
    return f"a fuzz run with a time budget per harness ({budget} s)" if budget else None


def _dev_tools() -> str | None:
    missing = []
    for dist in DEV_TOOLS:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    return f"{', '.join(missing)} not installed (development tools)" if missing else None


@dataclass(frozen=True)
class Probe:
    name: str
    what: str
    check: Callable[[], str | None]


PROBES: dict[str, Probe] = {
    p.name: p
    for p in (
        Probe("root", "running as root", _root),
        Probe("blkio", "a block-IO throttle (cgroup v1 blkio or v2 io.max)", _blkio),
        Probe("site-net", "network namespaces, a bridge, veth pairs and tc tbf", _site_net),
        Probe("netem", "the netem qdisc (delays on the site network)", _netem),
        Probe("own-udevd", "no udev daemon running that the tests did not start", _own_udevd),
        Probe("pty", "pseudo-terminals", _pty),
        Probe("pods", "real containers in the test CRI-O (go, cc, runc)", _pods),
        Probe("skopeo", "Debian's skopeo", _tool("skopeo", "skopeo")),
        Probe("bash", "bash (shell completion)", _tool("bash", "bash")),
        Probe("rpm", "rpm (the spec's macros expanded by rpm --eval)", _tool("rpm", "rpm")),
        Probe("dev-tools", "the development tools (import-linter, mypy, ruff)", _dev_tools),
        Probe("unbudgeted", "fuzz harnesses run without a time budget", _unbudgeted),
    )
}


@functools.cache
def absent(name: str) -> str | None:
    """The probe's verdict, once per run: ``None`` (present) or what is missing."""
    return PROBES[name].check()


def skip_for(name: str, detail: str = "", *, allow_module_level: bool = False) -> NoReturn:
    """Skip the running test because capability ``name`` is missing (``detail``: what the
    attempt found)."""
    if name not in PROBES:
        raise KeyError(f"no probe named {name!r} in tests/capabilities.py")
    reason = f"[probe {name}] {detail or absent(name) or PROBES[name].what}"
    pytest.skip(reason, allow_module_level=allow_module_level)


def skip_unless(name: str, *, allow_module_level: bool = False) -> None:
    """Skip the running test unless the machine has capability ``name``."""
    if (missing := absent(name)) is not None:
        skip_for(name, missing, allow_module_level=allow_module_level)


def machine_kind() -> str:
    """What kind of machine this is, as tests/expected-skips.toml names them."""
    if os.environ.get("RPM_BUILD_ROOT"):
        return "rpm-check"
    if os.environ.get("NODEAGENT_COMPAT") == "debian13":
        return "compat-debian13"
    pid1 = Path("/proc/1/comm").read_text().strip() if Path("/proc/1/comm").exists() else ""
    cgroup2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    if pid1 == "systemd":
        return "systemd-cgroup2" if cgroup2 else "systemd-cgroup1"
    return "container-cgroup2" if cgroup2 else "container-cgroup1"


def allowed_absent(kind: str) -> frozenset[str] | None:
    """The probes tests/expected-skips.toml lets be absent on ``kind`` (None: a kind it does
    not know, where absent probes are printed but not judged)."""
    kinds = tomllib.loads(MANIFEST.read_text())["kinds"]
    entry = kinds.get(kind)
    if entry is None:
        return None
    unknown = set(entry["may_lack"]) - set(PROBES)
    if unknown:
        raise ValueError(f"tests/expected-skips.toml names unknown probes: {sorted(unknown)}")
    return frozenset(entry["may_lack"])


def probe_of(reason: str) -> str | None:
    found = TAG.search(reason)
    return found.group(1) if found else None


@dataclass
class Skipped:
    nodeid: str
    reason: str

    @property
    def probe(self) -> str | None:
        return probe_of(self.reason)


def judge(skipped: list[Skipped], kind: str) -> list[str]:
    """What is wrong with this run's skips (empty: nothing)."""
    problems = []
    for skip in skipped:
        if skip.probe is None:
            problems.append(f"{skip.nodeid} skipped without a probe: {skip.reason}")
        elif skip.probe not in PROBES:
            problems.append(f"{skip.nodeid} skipped for an unknown probe {skip.probe!r}")
        elif absent(skip.probe) is None:
            problems.append(
                f"{skip.nodeid} skipped for probe {skip.probe}, which says it is there: "
                f"{skip.reason}"
            )
    allowed = allowed_absent(kind)
    if allowed is not None:
        for name in sorted({s.probe for s in skipped if s.probe in PROBES} - allowed):
            if absent(name) is not None:
                problems.append(
                    f"probe {name} is absent ({absent(name)}), which tests/expected-skips.toml "
                    f"does not allow on a {kind} machine"
                )
    return problems


def main() -> int:
    kind = machine_kind()
    print(f"machine kind: {kind}")
    for probe in PROBES.values():
        verdict = absent(probe.name)
        print(f"  {probe.name:<10} {'yes' if verdict is None else 'NO: ' + verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
