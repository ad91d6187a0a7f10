"""The container variant's counterparts of the RPM's other units (systemd/container/): the node
mirror, the mirror sessions, foreign-pins and mirror-dropin run the same image as
nodeagent.service, with every mount at the path the configuration names (or a named host
facility), what each command reads and writes reachable, written only where the RPM's unit
may write, and no capability the RPM's unit does not have."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest

from nodeagent.config import Config
from nodeagent.daemon.peer_reports import REPORT_SOCKET
from tests.unit.container import ROOT
from tests.unit.container.test_unit_mounts import HOST_FACILITIES, canonical, config_paths

RPM = ROOT / "systemd"
CONTAINER = ROOT / "systemd" / "container"

_config = Config()
STORE = PurePosixPath(_config.store_dir)
SOURCE = PurePosixPath(_config.source)
RT = _config.runtime

NEEDS: dict[str, tuple[str, tuple[PurePosixPath, ...]]] = {
    "nodeagent-mirror.service": (
        "serve-mirror",
        (SOURCE, STORE, PurePosixPath(_config.state.run_dir / REPORT_SOCKET)),
    ),
    "nodeagent-session@.service": ("serve-session", (SOURCE, STORE)),
    "nodeagent-foreign-pins.service": (
        "render-pins --write --reload",
        (
            SOURCE,
            PurePosixPath(RT.config_file),
            PurePosixPath(RT.config_dir),
            PurePosixPath(RT.transient_dropin_dir),
            PurePosixPath(_config.state.dir),
            PurePosixPath(_config.state.run_dir),
        ),
    ),
    "nodeagent-mirror-dropin.service": (
        "render-mirror-dropin --write --reload",
        (
            SOURCE,
            STORE,
            PurePosixPath(RT.registries_conf),
            PurePosixPath(RT.registries_dir),
        ),
    ),
}
"""Each counterpart: the command it runs (the RPM unit's) and the paths that command uses."""

SOCKETS = {"/run/systemd/journal", "/run/dbus/system_bus_socket"}
"""Written mounts that are sockets to talk to, not files written."""


def directives(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def run_words(unit: str) -> list[str]:
    """The words of the unit's ``podman run`` (its ExecStart's ``sh -c`` script)."""
    (line,) = directives(CONTAINER / unit)["ExecStart"]
    found = re.fullmatch(r"/bin/sh -c '(.*)'", line.strip())
    assert found is not None, unit
    words = shlex.split(found.group(1).replace("$$", "$"))  # systemd unescapes $$
    assert words[:3] == ["exec", "$NODEAGENT_PODMAN", "run"], unit
    return words


def volumes(words: list[str]) -> dict[PurePosixPath, tuple[PurePosixPath, set[str]]]:
    found: dict[PurePosixPath, tuple[PurePosixPath, set[str]]] = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--volume":
            source, target, *opts = value.split(":")
            found[PurePosixPath(target)] = (PurePosixPath(source), set(",".join(opts).split(",")))
    return found


def deepest(
    path: PurePosixPath, mounts: dict[PurePosixPath, tuple[PurePosixPath, set[str]]]
) -> PurePosixPath | None:
    """The mount that holds ``path`` (the deepest of those covering it)."""
    path = canonical(path)
    covering = [m for m in mounts if m == path or m in path.parents]
    return max(covering, key=lambda m: len(m.parts)) if covering else None


def under_any(path: PurePosixPath, roots: list[PurePosixPath]) -> bool:
    return any(path == r or r in path.parents for r in roots)


@pytest.mark.parametrize("unit", sorted(NEEDS))
def test_it_runs_the_rpm_units_command_from_the_daemons_image(unit: str) -> None:
    words = run_words(unit)
    command, _ = NEEDS[unit]
    assert words[-len(command.split()) :] == command.split()
    assert words[-len(command.split()) - 1] == "$NODEAGENT_IMAGE"
    rpm = directives(RPM / unit)["ExecStart"][0]
    assert rpm.split()[1:] == command.split(), "the RPM's unit runs another command"
    found = directives(CONTAINER / unit)
    assert found["EnvironmentFile"] == ["/run/nodeagent/image.env"]  # the daemon's image
    for flag in ("--pull=never", "--rm", "--log-driver=passthrough", "--cgroups=split"):
        assert flag in words, (unit, flag)


@pytest.mark.parametrize("unit", sorted(NEEDS))
def test_every_mount_is_at_its_own_path_and_needed(unit: str) -> None:
    mounts = volumes(run_words(unit))
    named = {canonical(path) for _, path in config_paths(Config())}
    named |= {canonical(path) for path in NEEDS[unit][1]}
    for target, (source, _) in mounts.items():
        assert source == target, f"{unit}: {source} is mounted at {target}: paths must not move"
        used = any(p == target or target in p.parents for p in named)
        assert used or str(target) in HOST_FACILITIES, f"{unit}: why is {target} mounted?"


@pytest.mark.parametrize("unit", sorted(NEEDS))
def test_what_the_command_uses_is_reachable(unit: str) -> None:
    mounts = volumes(run_words(unit))
    _, needed = NEEDS[unit]
    missing = [str(p) for p in needed if deepest(p, mounts) is None]
    assert not missing, f"{unit}: not reachable: {missing}"
    assert PurePosixPath("/run/systemd/journal") in mounts, unit


@pytest.mark.parametrize("unit", sorted(NEEDS))
def test_written_only_where_the_rpm_unit_may_write(unit: str) -> None:
    """A mount without ``ro`` is a path the RPM's unit lists in ReadWritePaths= (its
    ProtectSystem=strict makes the rest read-only), or a socket talked to."""
    rpm = directives(RPM / unit)
    assert rpm.get("ProtectSystem") == ["strict"], unit
    writable = [
        PurePosixPath(p.lstrip("-")) for line in rpm.get("ReadWritePaths", []) for p in line.split()
    ]
    for target, (_, opts) in volumes(run_words(unit)).items():
        if "ro" in opts or str(target) in SOCKETS:
            continue
        assert under_any(target, writable), f"{unit}: {target} is writable here, not in the RPM's"


@pytest.mark.parametrize("unit", sorted(NEEDS))
def test_no_capability_the_rpm_unit_lacks(unit: str) -> None:
    words = run_words(unit)
    assert "--privileged" not in words
    assert "--cap-drop=all" in words
    assert ["--security-opt", "no-new-privileges"] in [list(p) for p in itertools.pairwise(words)]
    added = {c for w in words if w.startswith("--cap-add=") for c in w[10:].split(",")}
    rpm = directives(RPM / unit)
    bounding = set(" ".join(rpm.get("CapabilityBoundingSet", [""])).split())
    assert added <= bounding, (unit, added - bounding)
    if rpm.get("User") == ["nodeagent-peer"]:
        user = words[words.index("--user") + 1]
        assert user == "$(id -u nodeagent-peer):$(id -g nodeagent-peer)", unit


def test_the_mirror_takes_systemds_socket_as_pid_1_with_no_network() -> None:
    """podman passes LISTEN_FDS on with LISTEN_PID=1: the mirror must be PID 1 of its own PID
    namespace (docs/runtime-facts.md), and needs no network (the socket is the host's)."""
    words = run_words("nodeagent-mirror.service")
    assert not any(w.startswith("--pid") for w in words)
    assert "--network=$NODEAGENT_NO_NETWORK" in words
    assert found_env("nodeagent-mirror.service")["NODEAGENT_NO_NETWORK"] == "none"
    assert "--sdnotify=container" in words
    found = directives(CONTAINER / "nodeagent-mirror.service")
    assert found["Type"] == ["notify"] and found["NotifyAccess"] == ["all"]
    assert found["Requires"] == ["nodeagent-mirror.socket"]


def found_env(unit: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in directives(CONTAINER / unit).get("Environment", []))
    return {key: value for key, value in pairs}


@pytest.mark.parametrize(
    "unit", ["nodeagent-foreign-pins.service", "nodeagent-mirror-dropin.service"]
)
def test_the_one_shot_renderers_have_no_network(unit: str) -> None:
    """The RPM's units have PrivateNetwork=yes: no network namespace of the host's."""
    assert "--network=$NODEAGENT_NO_NETWORK" in run_words(unit)
    assert found_env(unit)["NODEAGENT_NO_NETWORK"] == "none"


def test_a_session_reads_its_connection_on_standard_input() -> None:
    words = run_words("nodeagent-session@.service")
    assert "--network=host" in words  # its listener on 127.0.0.1, for CRI-O's pulls
    found = directives(CONTAINER / "nodeagent-session@.service")
    assert found["StandardInput"] == ["socket"]


def test_the_path_and_socket_units_are_the_rpms_and_trigger_these() -> None:
    for trigger, unit in (
        ("nodeagent-foreign-pins.path", "nodeagent-foreign-pins.service"),
        ("nodeagent-mirror-dropin.path", "nodeagent-mirror-dropin.service"),
    ):
        assert directives(RPM / trigger)["Unit"] == [unit]
    assert directives(RPM / "nodeagent-session.socket")["Accept"] == ["yes"]
    assert directives(RPM / "nodeagent-mirror.socket")["Accept"] == ["no"]
