"""What the daemon holds in memory while idle: modules only some events need stay unloaded.

Each module here costs resident memory for the daemon's whole life (the bundle importer
with its adapters about 2 MiB; docs/performance.md). They load when their event comes:
the first medium, the first spec file read, the first signing key. dbus-fast (about 3 MiB)
never loads: a runtime reload runs it in a child process (docs/decisions/0050). grpcio
(10 MiB) is not loaded at all: the CRI client speaks gRPC over h2. A fresh interpreter
parses ``nodeagent run``'s command line and builds the daemon's wiring, exactly as
``nodeagent run`` does before its first sync, then lists ``sys.modules``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.capabilities import skip_for

IDLE_PATH = """
import sys
from pathlib import Path

from nodeagent.cli import main as cli

from nodeagent.daemon import root as daemon
from nodeagent.config import load_config

root = Path(sys.argv[1])
args = cli._parser(cli._command_of(["run"])).parse_args(["run"])
config = load_config(args.config, root=root)
daemon.build(config)
print("\\n".join(sorted(sys.modules)))
"""

NOT_LOADED_AT_IDLE = (
    "grpc",  # never: the CRI client speaks gRPC over h2 (docs/decisions/0004), 10 MiB less
    "dbus_fast",  # never: the reload's child process loads it (decision 0050)
    "nodeagent.adapters.systemd_bus",
    "yaml",  # the first spec file read (specs.parse_spec_text)
    "cryptography",  # bundle signatures only
    "pyudev",  # the media loop, when bundles.watch_media is on
    "nodeagent.daemon.bundles",  # the first bundle import
    "nodeagent.bundles.importer",
    "nodeagent.bundles.handover",
    "nodeagent.bundles.minisign",
    "nodeagent.bundles.minisign_kdf",
    "nodeagent.bundles.mirror",  # the import's mirror (the node mirror's drop-in and the offline
    "nodeagent.bundles.tags",  # check name repositories through registries.dropin: 0.9 MiB)
    "nodeagent.bundles.manifest",
    "nodeagent.adapters.bundles.node_mirror_dropin",  # the node mirror's drop-in: once the
    "nodeagent.registries.dropin",  # store holds something, or a drop-in is to be removed
    "nodeagent.adapters.http.mirror",
    "nodeagent.adapters.bundles.session_server",  # a mirror session's process (decision 0064)
    "nodeagent.bundles.session",
    "nodeagent.daemon.session",  # the session process's side: never in the daemon
    "aiohttp",  # the loopback mirror, the peer server, the fetcher (docs/decisions/0027)
    "nodeagent.daemon.site",  # the peer server: its own process (decision 0056)
    "nodeagent.daemon.peer_reports",  # the peer process's reports: [site] serve = true only
    "nodeagent.adapters.peer_reports",
    "prometheus_client",  # the metrics endpoint: [metrics] enabled = true only (decision 0046)
    "nodeagent.adapters.metrics",
    "nodeagent.daemon.metrics",
    "nodeagent.metrics.recorder",  # only the port and its no-op are loaded with metrics off
    "nodeagent.metrics.series",
    "nodeagent.adapters.http.peer",
    "nodeagent.adapters.bundles.writer",
    "nodeagent.adapters.bundles.mount",
    "nodeagent.adapters.store.blobs",  # the store: once it holds something (or has to)
    "nodeagent.adapters.store.registry_sets",
    "nodeagent.cli.bundle",  # the administrator's commands: never for `nodeagent run`
    "nodeagent.cli.bundle_create",
    "nodeagent.cli.terminal",
    "nodeagent.cli.store",
    "nodeagent.cli.site",
    "difflib",  # did-you-mean for a broken config only
    "ctypes.util",  # inotify takes libc from the process itself
    "getpass",  # a locked signing key on a terminal only
)

DEV_ONLY = {"grpc": "grpcio"}
"""Modules of a development dependency (module: distribution): absent where it is not installed."""


@pytest.fixture(scope="module", params=["default", "registry_sets"])
def idle_modules(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> set[str]:
    """Idle with the default configuration, and with ``[store] registry_sets`` on: the store's
    code loads at the first sync that has an image to fetch, not at start."""
    root = tmp_path_factory.mktemp("root")
    if request.param == "registry_sets":
        config = root / "etc" / "nodeagent" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text("[store]\nregistry_sets = true\n")
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", IDLE_PATH, str(root)],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_the_idle_path_builds_the_real_wiring(idle_modules: set[str]) -> None:
    # The probe must have gone through what it claims to: CRI client, registry client, inotify.
    for module in (
        "nodeagent.adapters.cri.h2",
        "h2.connection",
        "nodeagent.daemon.root",
        "nodeagent.adapters.registry.client",
        "nodeagent.bundles.imports",
    ):
        assert module in idle_modules


@pytest.mark.parametrize("module", NOT_LOADED_AT_IDLE)
def test_module_is_not_loaded_at_idle(idle_modules: set[str], module: str) -> None:
    assert module not in idle_modules


@pytest.mark.parametrize("module", NOT_LOADED_AT_IDLE)
def test_module_named_exists(module: str) -> None:
    # "not loaded" holds for a name that does not exist: a renamed module must fail here.
    if module in DEV_ONLY:
        try:
            importlib.metadata.distribution(DEV_ONLY[module])
        except importlib.metadata.PackageNotFoundError:
            skip_for("dev-tools", f"{DEV_ONLY[module]} is not installed here")
    assert importlib.util.find_spec(module) is not None, f"no module named {module}"


IMPORT_PATH = """
import sys
from pathlib import Path

from nodeagent.config import load_config
from nodeagent.daemon import bundles
from nodeagent.daemon.policies import policies_from
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.systemd import RuntimeReloader

config = load_config(Path(sys.argv[1]) / "config.toml", root=Path(sys.argv[1]))
policies = policies_from(config)
cri = CriClient(config.runtime.endpoint)
reloader = RuntimeReloader("crio.service")
bundles.build_importer(config, policies, cri, reloader, report=lambda _r: None)
bundles.build_restorer(config, policies, cri, reloader)
print("\\n".join(sorted(sys.modules)))
"""


def test_imports_and_restores_load_no_http_server(tmp_path: Path) -> None:
    # The loopback mirror of an import or a restore is a process of its own (decision 0064):
    # the daemon that built its importer and restorer has loaded neither aiohttp nor the
    # server, only the launcher that asks for that process.
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_PATH, str(tmp_path)],
        capture_output=True, text=True, check=False, cwd=repo,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "nodeagent.adapters.bundles.session_server" in loaded  # the probe built them
    assert "nodeagent.bundles.importer" in loaded and "nodeagent.bundles.restore" in loaded
    assert not {m for m in loaded if m == "aiohttp" or m.startswith("aiohttp.")}
    assert not {m for m in loaded if m.startswith("nodeagent.adapters.http")}
    assert "nodeagent.daemon.session" not in loaded


def test_the_http_faces_load_aiohttps_low_level_server_only() -> None:
    # aiohttp.web (application, router, file responses, websockets) is 1.8 MiB the peer
    # server and the loopback mirror do not use (docs/performance.md).
    probe = (
        "import sys, nodeagent.daemon.site, nodeagent.adapters.http.mirror\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('aiohttp.web')))"
    )
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=repo
    )
    loaded = set(result.stdout.split())
    assert "aiohttp.web_server" in loaded
    assert loaded.isdisjoint({"aiohttp.web", "aiohttp.web_app", "aiohttp.web_urldispatcher"})


RELOAD_PATH = """
import asyncio, os, signal, subprocess, sys
from pathlib import Path
from nodeagent.adapters.systemd import RuntimeReloader

runtime = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
pid_file = Path(sys.argv[1])
pid_file.write_text(str(runtime.pid))
reloader = RuntimeReloader(
    "crio.service", pid_file=pid_file, bus_address="unix:path=" + sys.argv[2], timeout_s=5
)
try:
    print(asyncio.run(reloader.reload()))
finally:
    runtime.kill()
print(" ".join(sorted(sys.modules)))
"""


def test_a_reload_leaves_dbus_fast_out_of_the_daemon(tmp_path: Path) -> None:
    # A real reload: the child tries the bus (no socket there), the daemon signals the PID.
    result = subprocess.run(
        [sys.executable, "-c", RELOAD_PATH, str(tmp_path / "pid"), str(tmp_path / "no-bus")],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    *_logged, path, modules = result.stdout.splitlines()  # the reloader's log lines first
    assert path == "sighup"  # the child ran, found no bus, and the fallback was taken
    assert "dbus_fast" not in modules.split()
    assert "nodeagent.adapters.systemd_bus" not in modules.split()
