"""A node to boot under nspawn: the cached Debian root, nodeagent's RPMs, CRI-O as crio.service.

``make_node_root(base, rpms, registry_host)`` unpacks the root file system, installs the
RPMs with ``rpm -i --root`` (their scriptlets run, chrooted: the preset enables
nodeagent.service, the journal catalog is compiled), and sets CRI-O up the way a node
has it: ``/etc/crio/crio.conf`` and ``crio.conf.d``, ``/etc/containers/*``, the socket at
``/var/run/crio/crio.sock``, and ``crio.service`` (Type=notify, ``ExecReload`` sends HUP).
The CRI-O binary built by the test environment is bound in read-only at boot
(``node_options``). nodeagent runs with the packaged configuration; only
``/etc/nodeagent/config.d/50-e2e.toml`` lowers the disk reserve, which depends on this
machine's disk rather than on the node, and lets the node take sticks from loop devices.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.testenv.agent import pinned_image_set_yaml
from tests.testenv.crio import PINNS_PLACEHOLDER
from tests.testenv.crio_build import ensure_crio
from tests.testenv.nspawn import Container
from tests.testenv.rootfs import unpack
from tests.testenv.udev import TEST_MEDIA_CONFIG
from tests.testenv.waiting import wait_for

CRIO_UNIT = """# CRI-O as a node runs it (written by nodeagent's test environment).
[Unit]
Description=Container Runtime Interface for OCI (CRI-O)
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
ExecStart=/usr/bin/crio
ExecReload=/bin/kill -s HUP $MAINPID
Restart=on-failure
RestartSec=2s
TimeoutStartSec=120s

[Install]
WantedBy=multi-user.target
"""

CRIO_CONF = """# CRI-O configuration of the e2e node: every setting in files (a reload drops flags).
[crio]
storage_driver = "vfs"

[crio.api]
listen = "/var/run/crio/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "crun"
conmon = "/usr/bin/conmon"
conmon_cgroup = "pod"
cgroup_manager = "cgroupfs"
pinns_path = "/usr/local/bin/pinns"
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"
hooks_dir = []
cdi_spec_dirs = []
enable_criu_support = false
disable_hostport_mapping = true

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
monitor_path = "/usr/bin/conmon"

[crio.image]
pause_image = "localhost/nodeagent-test/pause:none"
pinned_images = []

[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/usr/libexec/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""

MASKED_UNITS = (
    # Timers that would run apt or fsck-like jobs in the middle of a test.
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "systemd-tmpfiles-clean.timer",
)

E2E_CONFIG = f"""# nodeagent e2e: the reserve depends on the test machine's disk, not the node's.
[disk]
reserve_bytes = "64MiB"
reserve_percent = 0.0

# The node's sticks are loop devices: the loop bus is allowed besides the default usb
# (docs/decisions/0054).
[bundles]
{TEST_MEDIA_CONFIG}
"""

DB_PATH = "/var/lib/rpm"


def _write(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def _symlink(root: Path, path: str, target: str) -> None:
    link = root / path.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def rpm_in_root(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``rpm`` on the root's own database (Debian's rpm defaults to ~/.rpmdb)."""
    cmd = ["rpm", f"--root={root}", f"--dbpath={DB_PATH}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def install_rpms(root: Path, rpms: Sequence[Path]) -> None:
    """``rpm -i`` into the root, scriptlets included. ``--nodeps``: Debian's packages
    (python3, systemd) are not in an rpm database; cri-o is the binary bound in at boot."""
    rpm_in_root(root, "-i", "--nodeps", *(str(p) for p in rpms))


def write_crio(root: Path, registry_host: str) -> None:
    _write(root, "/etc/crio/crio.conf", CRIO_CONF)
    (root / "etc/crio/crio.conf.d").mkdir(parents=True, exist_ok=True)
    registries = 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n\n'
    registries += f'[[registry]]\nlocation = "{registry_host}"\ninsecure = true\n'
    _write(root, "/etc/containers/registries.conf", registries)
    (root / "etc/containers/registries.conf.d").mkdir(parents=True, exist_ok=True)
    policy = {"default": [{"type": "insecureAcceptAnything"}]}
    _write(root, "/etc/containers/policy.json", json.dumps(policy))
    _write(root, "/usr/local/bin/pinns", PINNS_PLACEHOLDER, mode=0o755)
    (root / "etc/cni/net.d").mkdir(parents=True, exist_ok=True)
    (root / "usr/libexec/cni").mkdir(parents=True, exist_ok=True)
    _write(root, "/etc/systemd/system/crio.service", CRIO_UNIT)
    _symlink(root, "/etc/systemd/system/multi-user.target.wants/crio.service",
             "/etc/systemd/system/crio.service")  # fmt: skip


def make_node_root(base: Path, rpms: Sequence[Path], registry_host: str) -> Path:
    """An unpacked root with nodeagent installed and CRI-O set up; returns the root."""
    root = unpack(base / "root")
    install_rpms(root, rpms)
    write_crio(root, registry_host)
    for unit in MASKED_UNITS:
        _symlink(root, f"/etc/systemd/system/{unit}", "/dev/null")
    _write(root, "/etc/nodeagent/config.d/50-e2e.toml", E2E_CONFIG)
    return root


def node_options(extra: Sequence[str] = ()) -> list[str]:
    """nspawn options of the node: the CRI-O binary built by the test environment."""
    return [f"--bind-ro={ensure_crio()}:/usr/bin/crio", *extra]


class Node:
    """A booted node: the container, its root on disk, and what the tests ask of it."""

    def __init__(self, root: Path, container: Container) -> None:
        self.root = root
        self.container = container

    # ------------------------------------------------------------ endpoints
    @property
    def cri_endpoint(self) -> str:
        """CRI-O's socket inside the container, reachable from here."""
        return f"unix://{self.container.live('/run/crio/crio.sock')}"

    @property
    def bus_address(self) -> str:
        """The container's system bus (its systemd on it), reachable from here."""
        return f"unix:path={self.container.live('/run/dbus/system_bus_socket')}"

    # ------------------------------------------------------------ files
    def write_set(self, name: str, refs: list[str]) -> Path:
        """A persistent PinnedImageSet file, written atomically (rename) into the spec dir."""
        directory = self.root / "etc/nodeagent/pinnedimagesets.d"
        final = directory / f"{name}.yaml"
        partial = directory / f".{name}.yaml.partial"
        partial.write_text(pinned_image_set_yaml(name, refs))
        partial.rename(final)
        return final

    def status(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.root / "var/lib/nodeagent/status.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], *, what: str, timeout_s: float = 120
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status()
            return status if status is not None and predicate(status) else None

        return wait_for(
            check,
            timeout_s=timeout_s,
            interval_s=0.2,
            what=what,
            detail=lambda: f"status: {self.status()}\n{self.journal('-u', 'nodeagent')[-4000:]}",
        )

    # ------------------------------------------------------------ systemd
    def journal(self, *args: str) -> str:
        return self.container.journal(*args)

    def journal_entries(self, *args: str) -> list[dict[str, Any]]:
        """``journalctl -o json`` entries (one JSON object a line)."""
        out = self.container.journal("-o", "json", *args)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        return self.container.show(unit, *properties)

    def wait_active(self, *units: str, timeout_s: float = 60) -> None:
        """Wait until every unit is active (for Type=notify: READY=1 was received)."""
        for unit in units:
            wait_for(
                functools.partial(self.is_active, unit),
                timeout_s=timeout_s,
                interval_s=0.2,
                what=f"{unit} to become active",
                detail=functools.partial(self.unit_status, unit),
            )

    def is_active(self, unit: str) -> bool:
        return self.show(unit, "ActiveState")["ActiveState"] == "active"

    def unit_status(self, unit: str) -> str:
        return self.container.systemctl("status", unit, check=False).stdout

    def wait_event(self, *events: str, timeout_s: float = 120) -> dict[str, Any]:
        """The first journal entry of any of ``events`` from the unit's current invocation."""
        invocation = self.show("nodeagent.service", "InvocationID")["InvocationID"]
        matches = [f"NODEAGENT_EVENT={event}" for event in events]  # journalctl ORs them

        def logged() -> dict[str, Any] | None:
            entries = self.journal_entries(f"_SYSTEMD_INVOCATION_ID={invocation}", *matches)
            return entries[0] if entries else None

        return wait_for(
            logged,
            timeout_s=timeout_s,
            interval_s=0.2,
            what=f"{' or '.join(events)} from nodeagent (invocation {invocation})",
            detail=lambda: self.journal("-u", "nodeagent", "-n", "40"),
        )
