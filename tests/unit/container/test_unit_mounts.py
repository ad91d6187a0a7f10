"""The container variant's nodeagent.service (systemd/container/): every path the
configuration's defaults name reaches the container through one of its --volume mounts, and
every mount is either such a path or a host facility the daemon needs besides."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from nodeagent.config import Config
from tests.unit.container import build_image

ROOT = Path(__file__).resolve().parents[3]

UNIT = ROOT / "systemd" / "container" / "nodeagent.service"

HOST_FACILITIES = {
    "/dev": "sticks plugged in after the start (--privileged copies /dev once)",
    "/run/udev": "udev's database: the sticks' properties (ID_FS_LABEL, NODEAGENT_MEDIA)",
    "/run/systemd/journal": "the journal's native socket: fields and catalog ids",
    "/run/dbus/system_bus_socket": "systemd over D-Bus: CRI-O's reload job",
    "/var/tmp": "stall detection watches CRI-O's staging files (decision 0005)",
    "/var/lib/containers/storage": "CRI-O's image filesystem (ImageFsInfo): its free space"
    " for disk admission, the OS image's layers (decision 0060); read-only",
}
"""Mounts that no configuration key names, each with what needs it."""

IN_IMAGE = {
    "node_os.bootc": "a wrapper that runs the host's bootc (nsenter into PID 1's mounts)",
    "node_os.rpm_ostree": "a wrapper that runs the host's rpm-ostree",
    "bundles.fips_switch": "the container's own /proc: the kernel's switch is the host's",
}


def config_paths(obj: object, prefix: str = "") -> Iterator[tuple[str, PurePosixPath]]:
    """Every path a default of the configuration names, with its key."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            key = f"{prefix}.{field.name}" if prefix else field.name
            yield from config_paths(getattr(obj, field.name), key)
    elif isinstance(obj, Path):
        yield prefix, PurePosixPath(obj)
    elif isinstance(obj, tuple):
        for value in obj:
            yield from config_paths(value, prefix)
    elif isinstance(obj, str) and obj.startswith("unix://"):
        yield prefix, PurePosixPath(obj.removeprefix("unix://"))


def exec_line(name: str) -> list[str]:
    """The shell words of an Exec*= line's ``sh -c`` script."""
    text = UNIT.read_text().replace("\\\n", " ")
    found = re.search(rf"^{name}=/bin/sh -c '(.*?)'$", text, re.MULTILINE)
    assert found is not None, name
    return shlex.split(found.group(1))


def volumes(words: list[str]) -> dict[PurePosixPath, tuple[PurePosixPath, str]]:
    """``--volume SRC:DST[:OPTS]`` -> {DST: (SRC, OPTS)}."""
    found: dict[PurePosixPath, tuple[PurePosixPath, str]] = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--volume":
            source, target, *opts = value.split(":")
            found[PurePosixPath(target)] = (PurePosixPath(source), ",".join(opts))
    return found


def canonical(path: PurePosixPath) -> PurePosixPath:
    """/var/run is /run on the host and in the image (a link in both)."""
    text = str(path)
    return PurePosixPath("/run" + text[len("/var/run") :]) if text.startswith("/var/run/") else path


def covering(
    path: PurePosixPath, mounts: dict[PurePosixPath, tuple[PurePosixPath, str]]
) -> list[PurePosixPath]:
    path = canonical(path)
    return [m for m in mounts if path == m or m in path.parents]


def test_every_default_path_is_mounted_at_the_same_place() -> None:
    mounts = volumes(exec_line("ExecStart"))
    missing = []
    for key, path in config_paths(Config()):
        if key in IN_IMAGE:
            continue
        if not covering(path, mounts):
            missing.append(f"{key} = {path}")
    assert not missing, f"not reachable in the container: {missing}"
    for target, (source, _) in mounts.items():
        assert source == target, f"{source} is mounted at {target}: paths must not move"


def test_every_mount_is_a_configured_path_or_a_named_facility() -> None:
    mounts = volumes(exec_line("ExecStart"))
    named = {canonical(path) for _, path in config_paths(Config())}
    for target in mounts:
        used = any(p == target or target in p.parents for p in named)
        assert used or str(target) in HOST_FACILITIES, f"{target}: why is it mounted?"
    for facility in HOST_FACILITIES:
        assert PurePosixPath(facility) in mounts, facility


def test_read_only_where_nodeagent_only_reads() -> None:
    mounts = volumes(exec_line("ExecStart"))
    read_only = ("/var/lib/kubelet", "/etc/kubernetes", "/var/tmp", "/run/udev")
    for target in (*read_only, "/var/lib/containers/storage"):
        assert "ro" in mounts[PurePosixPath(target)][1].split(","), target
    for target in ("/var/lib/nodeagent", "/run/nodeagent", "/run/crio", "/etc/crio"):
        assert "ro" not in mounts[PurePosixPath(target)][1].split(","), target


def test_host_tools_are_wrappers_in_the_image() -> None:
    node_os = Config().node_os
    assert {node_os.bootc.name, node_os.rpm_ostree.name} == set(build_image.HOST_TOOLS)
    assert "nsenter --target 1 --mount" in build_image.HOST_TOOL


@pytest.mark.parametrize("name", ["ExecStart", "ExecStartPre"])
def test_runs_in_the_hosts_namespaces_with_the_journal(name: str) -> None:
    words = exec_line(name)
    for flag in ("--privileged", "--pid=host", "--network=host", "--log-driver=passthrough"):
        assert flag in words, (name, flag)
    assert words[-1] in {"run", "--write"}
    assert "--pull=never" in words  # the image is in nodeagent's storage: no registry, ever
    assert "$NODEAGENT_IMAGE" in words or any("NODEAGENT_IMAGE" in w for w in words)


def test_the_daemon_is_notify_with_container_sdnotify_split_cgroups_and_a_watchdog() -> None:
    words = exec_line("ExecStart")
    assert "--sdnotify=container" in words
    assert "--cgroups=split" in words
    assert words[-1] == "run"
    text = UNIT.read_text()
    for line in ("Type=notify", "NotifyAccess=all", "WatchdogSec=120s", "Restart=on-failure"):
        assert re.search(rf"^{line}$", text, re.MULTILINE), line
    assert "--env WATCHDOG_USEC" in text.replace("\\\n", " ")


def test_boot_pins_are_rendered_from_the_image_before_crio() -> None:
    pre = exec_line("ExecStartPre")
    assert pre[-2:] == ["render-pins", "--write"]
    assert re.search(r"^Before=crio\.service", UNIT.read_text(), re.MULTILINE)


def test_directories_holding_other_mounts_are_bound_without_them() -> None:
    """A recursive bind would copy pods' volume and shm mounts into nodeagent's namespace."""
    mounts = volumes(exec_line("ExecStart"))
    for target in (
        "/var/lib/kubelet",
        "/run/containers",
        "/var/lib/nodeagent",
        "/run/nodeagent",
        "/run/crio",
        "/var/lib/containers/storage",
    ):
        assert "bind" in mounts[PurePosixPath(target)][1].split(","), target
