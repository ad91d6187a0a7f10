"""Fixtures shared by every test: the real peers of tests/testenv.

Session-scoped peers are started once and torn down at the end; a test that
restarts, kills or fills the runtime takes ``fresh_crio`` instead.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from nodeagent.adapters.cri.client import CriClient
from tests import capabilities
from tests.testenv.crio import Crio
from tests.testenv.dbus import HupChild, hup_child_process, private_bus
from tests.testenv.images import (
    LayerSpec,
    PushedImage,
    TestImage,
    build_index,
    make_image_set,
    push,
)
from tests.testenv.kube import KubeCluster
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "fuzz", "service", "integration", "security", "faults", "e2e")
"""tests/ folders, cheapest first: a broken unit test fails ``make test`` in seconds."""

SLOW_FIXTURE_TIMEOUTS_S = {
    "kube": 120,  # starts etcd and kube-apiserver: 3 s here, far more on a loaded machine
    "big_images": 240,  # generates (first run: ~200 MB of gzip'ed layers) and pushes 6 images
    "rpms": 600,  # builds the RPMs (%check runs the unit tests; a cold wheelhouse downloads)
    "node": 600,  # unpacks the nspawn root, installs the RPMs, boots systemd, waits for units
}
"""Session fixtures whose setup the first test that uses them pays for: its time limit.

pytest-timeout counts fixtures (``timeout_func_only = false`` in pyproject.toml): a peer
that hangs while it starts or stops fails the test with a traceback instead of hanging
``make test``. A test marked with a longer limit keeps its own.
"""


def _tier(item: pytest.Item) -> int:
    top = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
    return TIERS.index(top) if top in TIERS else len(TIERS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tiers in ``TIERS`` order (``testpaths`` is just tests/, collected by name);
    give the tests that may start a slow session fixture that fixture's time limit.

    The sort is stable, so each module's tests stay together and in file order.
    """
    items.sort(key=_tier)
    for item in items:
        used = getattr(item, "fixturenames", ())
        limit = max((SLOW_FIXTURE_TIMEOUTS_S.get(name, 0) for name in used), default=0)
        mark = item.get_closest_marker("timeout")
        marked = (mark.args or (mark.kwargs.get("timeout", 0),))[0] if mark else 0
        if limit > marked:
            item.add_marker(pytest.mark.timeout(limit), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what the collected tests' peers need before the first test, outside its limit.

    On a fresh machine that is minutes of work (Debian packages, go builds of CRI-O and
    kube-apiserver, the nspawn root); ``make test`` did it already (``make testenv``), and
    then this only looks at the caches. Unit and service tests need none of it, nor does
    ``--collect-only`` (tests/unit/test_collection.py).
    """
    tiers = {TIERS[_tier(item)] for item in session.items if _tier(item) < len(TIERS)}
    with_peers = {"integration", "security", "faults", "e2e"}
    if session.config.option.collectonly or not tiers & with_peers:
        return
    _keep_peers_off_the_host(session.config)
    from tests.testenv.__main__ import missing, prepare

    nspawn_root = "e2e" in tiers
    todo = missing(nspawn_root=nspawn_root)
    if not todo:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = print if reporter is None else reporter.write_line
    say(f"testenv: preparing {', '.join(todo)} before the first test (once, then cached)")
    prepare(nspawn_root=nspawn_root, say=say)


_HOST_VIEW = pytest.StashKey[Any]()


def _keep_peers_off_the_host(config: pytest.Config) -> None:
    """The peers the tests start (CRI-O, skopeo, podman) write containers/image's blob-info
    cache under ``/var/lib/containers``: the session gets a tmpfs there of its own
    (``tests/testenv/host_view.py``). As root only: the unit tests (rpmbuild's %check) start
    no peer."""
    if os.geteuid() != 0:
        return
    from tests.testenv.host_view import HostViewError, private_containers_dir

    try:
        config.stash[_HOST_VIEW] = private_containers_dir()
    except HostViewError as exc:
        raise pytest.UsageError(f"cannot keep the peers' files off this machine: {exc}") from exc


@pytest.fixture(scope="session")
def host_view(pytestconfig: pytest.Config) -> Any:
    """The session's ``PrivateContainersDir`` (None when not root: no peer runs then)."""
    return pytestconfig.stash.get(_HOST_VIEW, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    view = config.stash.get(_HOST_VIEW, None)
    if view is not None:
        view.close()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs("probe", ...)``: skip unless each capability is there."""
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            capabilities.skip_unless(name)


SKIPPED: list[capabilities.Skipped] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        SKIPPED.append(capabilities.Skipped(report.nodeid, str(report.longrepr[2])))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a skip was an accident (tests/capabilities.py)."""
    if session.config.option.collectonly:
        return
    problems = capabilities.judge(SKIPPED, capabilities.machine_kind())
    session.config.stash[_PROBLEMS] = problems
    if problems and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_PROBLEMS = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The probes behind this run's skips, each skipped test with its probe, and what is
    wrong with them. Every probe is printed when something skipped (cheap probes only
    otherwise: the site network's take a second each)."""
    config = terminalreporter.config
    if config.option.collectonly:
        return
    kind = capabilities.machine_kind()
    write = terminalreporter.write_line
    terminalreporter.section("capability probes")
    write(f"machine kind: {kind}; skipped: {len(SKIPPED)}")
    names = capabilities.PROBES if SKIPPED else ("root", "blkio", "own-udevd", "pty", "skopeo")
    for name in names:
        verdict = capabilities.absent(name)
        write(f"  {name:<10} {'yes' if verdict is None else 'NO: ' + verdict}")
    for skip in SKIPPED:
        write(f"  skipped {skip.nodeid} [{skip.probe or 'NO PROBE'}]")
    for problem in config.stash.get(_PROBLEMS, []):
        terminalreporter.write_line(f"SKIP PROBLEM: {problem}", red=True, bold=True)


@pytest.fixture(autouse=True)
def _structlog_as_it_was() -> Iterator[None]:
    """A test that runs a command in-process (``cli.main.main``) configures structlog onto
    that test's captured stderr, which pytest closes after it: the next test logging
    in-process wrote to a closed file. The configuration is put back after each test."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    ensure_packages()
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def crio(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Crio]:
    runtime = Crio(tmp_path_factory.mktemp("crio"), insecure_registries=[registry.host])
    with runtime:
        yield runtime


@pytest.fixture
def fresh_crio(tmp_path: Path, registry: Registry) -> Iterator[Crio]:
    runtime = Crio(tmp_path / "crio", insecure_registries=[registry.host])
    with runtime:
        yield runtime


@pytest.fixture
async def cri(crio: Crio) -> AsyncIterator[CriClient]:
    async with CriClient(crio.endpoint, timeout_s=60) as client:
        yield client


@dataclass(frozen=True)
class Pushed:
    """Small test images in the session registry, referenced by digest."""

    host: str
    base_a: PushedImage
    base_b: PushedImage
    multiarch: PushedImage

    def ref(self, image: PushedImage) -> str:
        return image.reference(self.host)


@pytest.fixture(scope="session")
def big_images(registry: Registry) -> list[str]:
    """Six images of ~32 MB (8 MB shared base + 24 MB own layer), by digest reference."""
    images = make_image_set(6, layer_size_bytes=24 << 20, shared_base_size_bytes=8 << 20, seed=42)
    return [push(registry.url, i.repository, i.build()).reference(registry.host) for i in images]


@pytest.fixture(scope="session")
def pushed(registry: Registry) -> Pushed:
    base = LayerSpec(size_bytes=256 * 1024, seed=1)
    a = TestImage("nodeagent-test/app-a", [base, LayerSpec(64 * 1024, seed=2)]).build()
    b = TestImage("nodeagent-test/app-b", [base, LayerSpec(64 * 1024, seed=3)]).build()
    amd64 = TestImage("nodeagent-test/multi", [LayerSpec(32 * 1024, seed=4)]).build()
    arm64 = TestImage(
        "nodeagent-test/multi", [LayerSpec(32 * 1024, seed=5)], architecture="arm64"
    ).build()
    return Pushed(
        host=registry.host,
        base_a=push(registry.url, a.repository, a),
        base_b=push(registry.url, b.repository, b),
        multiarch=push(registry.url, "nodeagent-test/multi", build_index([amd64, arm64])),
    )


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB ext4 filesystem, loop-mounted, for a runtime's image store."""
    image = tmp_path / "store.img"
    mountpoint = tmp_path / "crio" / "lib" / "small"
    mountpoint.mkdir(parents=True)
    subprocess.run(["truncate", "-s", "48M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@pytest.fixture(scope="module")
def bus_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private dbus-daemon (no systemd on it); its address."""
    with private_bus(tmp_path_factory.mktemp("dbus")) as address:
        yield address


@pytest.fixture
async def hup_child(tmp_path: Path) -> AsyncIterator[HupChild]:
    """A real process that records a SIGHUP; its PID is in ``pid_file``."""
    async with hup_child_process(tmp_path) as child:
        yield child


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A running etcd + kube-apiserver (client certificates, Node,RBAC, NodeRestriction)."""
    with KubeCluster(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster
