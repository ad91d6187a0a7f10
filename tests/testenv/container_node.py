"""A node for the container variant (RHCOS-like: no RPM), booted under nspawn.

``make_container_node_root`` unpacks a Debian root that also has Debian's podman, sets CRI-O
up as tests/testenv/node.py does, and installs exactly what deploy/machineconfig/'s
MachineConfig carries (rendered by tools/render_machineconfig.py: its files, units,
drop-ins and enablement), as the Machine Config Daemon would write them. Two test
adjustments, each a drop-in: the agent image keys are the test's, no digest is pinned (the
first image comes from a stick), and podman runs with crun, cgroups off and
``E2E_DRIVER`` (see ``RUN_OPTS``).
"""

from __future__ import annotations

import re
import resource
import urllib.parse
from pathlib import Path
from typing import Any

from tests.testenv.agent_image import load_tool
from tests.testenv.node import E2E_CONFIG, MASKED_UNITS, _symlink, _write, write_crio
from tests.testenv.rootfs import ROOTFS_PACKAGES, rootfs_tarball, unpack

ROOT = Path(__file__).resolve().parents[2]
PODMAN_PACKAGES: tuple[str, ...] = (*ROOTFS_PACKAGES, "podman", "containernetworking-plugins")
E2E_DRIVER = "vfs"
PODMAN = (
    "/usr/bin/podman --root /var/lib/nodeagent/image/storage --runroot /run/nodeagent/image"
    f" --storage-driver {E2E_DRIVER} --cgroup-manager systemd --runtime /usr/bin/crun"
)
# Under nspawn on this machine (cgroup v1) the node's cgroup controllers are read-only: runc
# cannot create the container's cgroups, and crun refuses hybrid hierarchies unless cgroups
# are off. So the e2e runs `--cgroups=disabled` with crun, which podman allows only with a
# private PID namespace, and which takes every rlimit podman sets (the node's own NPROC
# limit). --cgroups=split and --pid=host are therefore not exercised here. nspawn's
# system call filter refuses session keyrings: containers.conf turns them off. nspawn keeps
# CAP_NET_ADMIN from the node, so crun cannot bring a new network namespace's loopback up:
# the units that run with no network (--network=none) run with the node's here.
NPROC = resource.getrlimit(resource.RLIMIT_NPROC)[1]
RUN_OPTS = f"--cgroups=disabled --pid=private --ulimit nproc={NPROC}:{NPROC}"
CONTAINERS_CONF = "[containers]\nkeyring = false\n"
E2E_DROPIN = f"""# nodeagent e2e: crun without cgroups, {E2E_DRIVER}; nothing pinned by digest.
[Service]
Environment="NODEAGENT_PODMAN={PODMAN}"
Environment="NODEAGENT_PODMAN_RUN_OPTS={RUN_OPTS}"
Environment=NODEAGENT_IMAGE_PINNED=
Environment=NODEAGENT_IMAGE_DRIVER={E2E_DRIVER}
Environment=NODEAGENT_NO_NETWORK=host
"""


PODMAN_UNITS = (
    "nodeagent.service",
    "nodeagent-peer.service",
    "nodeagent-image-load.service",
    "nodeagent-image-update.service",
    "nodeagent-mirror.service",
    "nodeagent-session@.service",
    "nodeagent-foreign-pins.service",
    "nodeagent-mirror-dropin.service",
)
"""The MachineConfig's units that run podman: each gets the e2e drop-in."""


def machine_config() -> dict[str, Any]:
    render = load_tool("render_machineconfig")
    config: dict[str, Any] = render.render(ROOT / "deploy/machineconfig/nodeagent.bu", ROOT)
    return config


def install_machine_config(root: Path, config: dict[str, Any]) -> None:
    """Files, units, drop-ins and enablement, as the MCD writes them."""
    ignition = config["spec"]["config"]
    for entry in ignition["storage"]["files"]:
        text = urllib.parse.unquote(entry["contents"]["source"].removeprefix("data:,"))
        _write(root, entry["path"], text, mode=entry["mode"])
    for unit in ignition["systemd"]["units"]:
        _write(root, f"/etc/systemd/system/{unit['name']}", unit["contents"])
        for dropin in unit.get("dropins", []):
            path = f"/etc/systemd/system/{unit['name']}.d/{dropin['name']}"
            _write(root, path, dropin["contents"])
        if unit.get("enabled"):
            for target in re.findall(r"^WantedBy=(\S+)$", unit["contents"], re.MULTILINE):
                link = f"/etc/systemd/system/{target}.wants/{unit['name']}"
                _symlink(root, link, f"/etc/systemd/system/{unit['name']}")


def make_container_node_root(base: Path, registry_host: str, image_key_pem: Path) -> Path:
    root = unpack(base / "root", rootfs_tarball(packages=PODMAN_PACKAGES))
    write_crio(root, registry_host)
    for unit in MASKED_UNITS:
        _symlink(root, f"/etc/systemd/system/{unit}", "/dev/null")
    install_machine_config(root, machine_config())
    _write(root, "/etc/nodeagent/image-keys.d/agent-images.pem", image_key_pem.read_text())
    (root / "etc/nodeagent/trusted-keys.d/bundle-key.pub").unlink()
    _write(root, "/etc/nodeagent/config.d/50-e2e.toml", E2E_CONFIG)
    _write(root, "/etc/containers/containers.conf", CONTAINERS_CONF)
    for unit in PODMAN_UNITS:
        _write(root, f"/etc/systemd/system/{unit}.d/90-e2e.conf", E2E_DROPIN)
    return root
