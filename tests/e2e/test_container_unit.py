"""The container variant end to end (docs/install-rhcos.md): a node with no RPM, what the
MachineConfig carries installed (tests/testenv/container_node.py), Debian's podman; the
first image, built by tools/build_image.py and signed with an agent image key, comes from an
ext4 stick on a loop device through nodeagent-image-load; nodeagent.service then runs it:
READY reached, its lines in ``journalctl -u nodeagent`` with their fields, a PinnedImageSet
pinned, ``systemctl kill`` recovered by Restart=, and after a reboot the pins rendered from
the image before CRI-O started. Long (an image build and a 150 MB vfs copy): ``make
container-e2e`` runs it; make test runs its sample (tests/integration/container,
tests/unit/container)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from tests.conftest import Pushed
from tests.e2e.test_reboot import start_pins
from tests.testenv.agent import set_state
from tests.testenv.agent_image import (
    agent_bundle,
    build_image_tool,
    derived_layout,
    ed25519_key,
    push_layout,
    signed_statement,
    tiny_archive,
    tiny_layout,
)
from tests.testenv.bundles import ext4_media
from tests.testenv.container_node import PODMAN as E2E_PODMAN
from tests.testenv.container_node import (
    install_machine_config,
    machine_config,
    make_container_node_root,
)
from tests.testenv.node import Node, node_options
from tests.testenv.nspawn import Container
from tests.testenv.registry import Registry
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device
from tests.testenv.waiting import wait_for

long_case = pytest.mark.container_long
SET = "e2e-container"


class Built:
    def __init__(
        self, stick_tree: Path, digest: str, key_pem: Path, private: Path, layout: Path
    ) -> None:
        self.stick_tree = stick_tree
        self.digest = digest
        self.key_pem = key_pem
        self.private = private
        self.layout = layout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The real image (make image's tool), its archive signed by a test agent image key."""
    base = tmp_path_factory.mktemp("image")
    private, public = ed25519_key(base / "keys", "agent-images")
    tool = build_image_tool()
    digest: str = tool.build(base / "layout", archive=True, sign_key=private)
    stick = base / "stick" / "nodeagent-image"
    stick.mkdir(parents=True)
    for made in (base / "layout").glob("nodeagent-*"):
        shutil.copy(made, stick / made.name)
    return Built(base / "stick", digest, public, private, base / "layout")


@pytest.fixture(scope="module")
def cnode(
    tmp_path_factory: pytest.TempPathFactory,
    built: Built,
    registry: Registry,
    host_udevd: Udevd,  # its /run/udev is bound in: the node sees sticks through udev
) -> Iterator[Node]:
    base = tmp_path_factory.mktemp("cnode")
    own_udevd = None
    if not Path("/run/udev").exists():  # a udevd another session started has gone since
        own_udevd = Udevd(base / "udevd")
        own_udevd.start()
    root = make_container_node_root(base, registry.host, built.key_pem)
    # openssl from this machine (RHCOS has the command; Debian's minbase root only its library).
    binds = ["--bind-ro=/usr/bin/openssl", "--bind-ro=/run/udev"]
    options = node_options(binds)
    # Boots wait for nodeagent.service (before crio.service), whose first start copies the
    # image's 150 MB root (vfs): more than the default minute.
    container = Container(
        root, base / "nspawn", machine="nodeagent-ce2e", options=options, boot_timeout_s=300
    )
    try:
        container.boot()
        yield Node(root, container)
    finally:
        container.stop()
        shutil.rmtree(root, ignore_errors=True)
        if own_udevd is not None:
            own_udevd.stop()


@pytest.fixture(scope="module")
def loaded(cnode: Node, built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stick plugged in, the loader run: the image is in nodeagent's own storage."""
    work = tmp_path_factory.mktemp("stick")
    media = ext4_media(work, built.stick_tree, label="NODEAGENT-IMAGE")
    devnode = free_loop_device()
    rdev = Path(devnode).stat().st_rdev
    mknod = f"[ -b {devnode} ] || mknod {devnode} b {os.major(rdev)} {os.minor(rdev)}"
    cnode.container.run("sh", "-c", mknod)
    media.attach(devnode)
    try:
        cnode.container.systemctl("restart", "nodeagent-image-load.service")
        yield devnode
    finally:
        media.detach()


@long_case
@pytest.mark.timeout(1200)
def test_the_first_image_comes_from_the_stick_and_the_unit_reaches_ready(
    cnode: Node, built: Built, loaded: str
) -> None:
    lines = cnode.journal("-u", "nodeagent-image-load", "-o", "cat")
    assert "nodeagent_image_loaded: archive=" in lines, lines
    assert built.digest in lines
    loaded_digest = cnode.container.live("/var/lib/nodeagent/image/loaded").read_text().strip()
    assert loaded_digest == built.digest
    cnode.container.systemctl("restart", "--no-block", "nodeagent.service")
    cnode.wait_active("crio.service", "nodeagent.service", timeout_s=300)
    env = cnode.container.live("/run/nodeagent/image.env").read_text()
    assert f"localhost/nodeagent@{built.digest}" in env
    # CRI-O's storage holds no trace of the agent's image: it lives in nodeagent's own.
    assert not (cnode.root / "var/lib/containers/storage/overlay-images").exists() or not any(
        built.digest.removeprefix("sha256:") in p.name
        for p in (cnode.root / "var/lib/containers/storage").rglob("*")
    )


@long_case
@pytest.mark.timeout(1200)
def test_the_daemons_lines_are_under_the_units_name_with_their_fields(
    cnode: Node, loaded: str
) -> None:
    cnode.wait_active("nodeagent.service", timeout_s=300)
    entry = cnode.wait_event("sync_finished", "daemon_started", timeout_s=180)
    assert entry["_SYSTEMD_UNIT"] == "nodeagent.service"
    assert entry["NODEAGENT_EVENT"] in {"sync_finished", "daemon_started"}


@long_case
@pytest.mark.timeout(1200)
async def test_a_set_is_pinned_by_the_container_agent(
    cnode: Node, loaded: str, pushed: Pushed
) -> None:
    cnode.wait_active("nodeagent.service", timeout_s=300)
    refs = [pushed.ref(pushed.base_a)]
    cnode.write_set(SET, refs)
    cnode.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned", timeout_s=240)
    async with CriClient(cnode.cri_endpoint) as cri:
        image = await cri.image_status(refs[0])
    assert image is not None and image.is_pinned


@long_case
@pytest.mark.timeout(1200)
def test_after_a_reboot_the_pins_are_rendered_from_the_image_before_crio_starts(
    cnode: Node, loaded: str, pushed: Pushed
) -> None:
    """render-pins --write runs from the image in the unit's ExecStartPre, and the unit is
    ordered before crio.service: the configuration CRI-O logs when it starts, before it
    listens, already holds the pins."""
    refs = [pushed.ref(pushed.base_a)]
    cnode.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned", timeout_s=240)
    cnode.container.reboot(timeout_s=120)
    cnode.wait_active("crio.service", "nodeagent.service", timeout_s=300)
    assert set(refs) <= set(start_pins(cnode))
    crio = cnode.show("crio.service", "ExecMainStartTimestampMonotonic")
    agent = cnode.show("nodeagent.service", "ActiveEnterTimestampMonotonic")
    assert int(crio["ExecMainStartTimestampMonotonic"]) > int(
        agent["ActiveEnterTimestampMonotonic"]
    )


@long_case
@pytest.mark.timeout(1200)
def test_systemctl_kill_then_restart_recovers(cnode: Node, loaded: str) -> None:
    cnode.wait_active("nodeagent.service", timeout_s=300)
    before = int(cnode.show("nodeagent.service", "NRestarts")["NRestarts"])
    cnode.container.systemctl("kill", "--signal=SIGKILL", "nodeagent.service")
    wait_for(
        lambda: int(cnode.show("nodeagent.service", "NRestarts")["NRestarts"]) > before or None,
        timeout_s=120,
        interval_s=0.5,
        what="nodeagent restarted",
        detail=lambda: cnode.unit_status("nodeagent.service"),
    )
    cnode.wait_active("nodeagent.service", timeout_s=300)


NEXT_SEQUENCE = 2**40
"""Above any SOURCE_DATE_EPOCH the first image's statement carries."""


def plug(cnode: Node, tree: Path, work: Path) -> LoopMedia:
    """``tree`` on an ext4 stick labelled NODEAGENT1 in the node, seen through udev."""
    work.mkdir(parents=True, exist_ok=True)
    media = ext4_media(work, tree)
    devnode = free_loop_device()
    rdev = Path(devnode).stat().st_rdev
    cnode.container.run(
        "sh", "-c", f"[ -b {devnode} ] || mknod {devnode} b {os.major(rdev)} {os.minor(rdev)}"
    )
    media.attach(devnode)
    return media


def self_update_from_a_stick(
    cnode: Node,
    registry: Registry,
    work: Path,
    layout: Path,
    *,
    version: str,
    sequence: int,
    key: Path,
) -> str:
    """A bundle carrying ``layout``'s image as nodeagent's, signed by ``key`` as an agent
    image key, plugged in: the daemon imports and stages it, the host's loader switches
    the unit to it. Returns the image's digest once nodeagent-image-update said so."""
    ref, digest = push_layout(registry.host, layout, version)
    statement = work / f"nodeagent-{version}.statement"
    signed_statement(statement, key, digest, sequence, version)
    public, secret = minisign.generate_keypair(comment=f"agent bundle {version}")
    bundle_id = f"agent-{version}"
    bundle = agent_bundle(work, registry.host, ref, statement, bundle_id=bundle_id, secret=secret)
    (cnode.root / f"etc/nodeagent/trusted-keys.d/{bundle_id}.pub").write_text(public)
    media = plug(cnode, bundle, work / "stick")
    try:
        wait_for(
            lambda: f"nodeagent_image_updating: image={digest}"
            in cnode.journal("-u", "nodeagent-image-update", "-o", "cat")
            or None,
            timeout_s=900,
            interval_s=2,
            what=f"the host switched to {digest}",
            detail=lambda: cnode.journal("-u", "nodeagent", "-u", "nodeagent-image-update",
                                         "-n", "40", "-o", "cat"),
        )  # fmt: skip
    finally:
        media.detach()
    return digest


def judge_until(cnode: Node, done: Callable[[], bool], what: str) -> None:
    """nodeagent-image-health.service run as its timer would, until ``done``."""

    def judged() -> bool | None:
        cnode.container.systemctl("start", "nodeagent-image-health.service")
        return done() or None

    wait_for(
        judged,
        timeout_s=300,
        interval_s=3,
        what=what,
        detail=lambda: cnode.journal("-u", "nodeagent-image-health", "-n", "20", "-o", "cat"),
    )


@long_case
@pytest.mark.timeout(1800)
def test_a_bundle_carrying_the_next_image_updates_the_agent(
    cnode: Node, built: Built, loaded: str, registry: Registry, tmp_path: Path
) -> None:
    """The next image (the first plus a marker layer) in a bundle on a stick, its statement
    signed by the agent image key: the daemon stages it, the host loads it and writes
    50-self-update.conf, nodeagent restarts on it, and the host's judge accepts it."""
    cnode.wait_active("nodeagent.service", timeout_s=300)
    layout, _ = derived_layout(built.layout, tmp_path / "next", "next")
    digest = self_update_from_a_stick(
        cnode, registry, tmp_path, layout, version="next", sequence=NEXT_SEQUENCE,
        key=built.private,
    )  # fmt: skip
    dropin = cnode.root / "etc/systemd/system/nodeagent.service.d/50-self-update.conf"
    assert f"NODEAGENT_IMAGE_NEXT={digest}" in dropin.read_text()
    env_file = cnode.container.live("/run/nodeagent/image.env")
    wait_for(
        lambda: f"localhost/nodeagent@{digest}" in env_file.read_text() or None,
        timeout_s=120,
        interval_s=0.5,
        what="nodeagent restarted on the next image",
    )
    cnode.wait_active("nodeagent.service", timeout_s=300)
    staged = cnode.journal("-u", "nodeagent", "NODEAGENT_EVENT=agent_image_staged", "-o", "cat")
    assert digest in staged
    health = cnode.root / "etc/systemd/system/nodeagent-image-health.service.d/90-e2e.conf"
    health.parent.mkdir(parents=True, exist_ok=True)
    health.write_text("[Service]\nEnvironment=NODEAGENT_IMAGE_TRIAL_S=10\n")
    cnode.container.systemctl("daemon-reload")
    accepted = cnode.root / "var/lib/nodeagent/image/accepted"
    judge_until(
        cnode,
        lambda: accepted.exists() and accepted.read_text().strip() == digest,
        "the next image accepted",
    )
    sequence = (cnode.root / "var/lib/nodeagent/image/sequence").read_text()
    assert sequence == f"{NEXT_SEQUENCE} {digest}\n"
    # The store keeps the bundle holding the running image, pinned by nodeagent-self.
    podman = E2E_PODMAN.split()
    shown = cnode.container.run(*podman, "exec", "nodeagent", "nodeagent", "store", "--json")
    view = json.loads(shown.stdout[shown.stdout.index("{") :])
    (bundle,) = [b for b in view["bundles"] if b["bundleId"] == "agent-next"]
    assert bundle["kept"] and "nodeagent-self" in bundle["pinnedSets"], bundle


@long_case
@pytest.mark.timeout(1800)
def test_a_bundle_carrying_a_broken_next_image_rolls_back(
    cnode: Node, built: Built, loaded: str, registry: Registry, tmp_path: Path
) -> None:
    """A signed next image that exits at start (no nodeagent in it): switched to, then the
    host's judge sees the restarts, rejects it, and nodeagent runs the image before it."""
    cnode.wait_active("nodeagent.service", timeout_s=300)
    env_file = cnode.container.live("/run/nodeagent/image.env")
    before = env_file.read_text().split("@", 1)[1].split()[0]
    layout, _ = tiny_layout(tmp_path / "broken", "broken")
    digest = self_update_from_a_stick(
        cnode, registry, tmp_path, layout, version="broken", sequence=NEXT_SEQUENCE + 1,
        key=built.private,
    )  # fmt: skip
    rolled = f"nodeagent_image_rolled_back: image={digest}"
    judge_until(
        cnode,
        lambda: rolled in cnode.journal("-u", "nodeagent-image-health",
                                        "-u", "nodeagent-image-rollback", "-o", "cat"),
        "the broken image rolled back",
    )  # fmt: skip
    rejected = cnode.root / "var/lib/nodeagent/image/rejected"
    assert digest in rejected.read_text()
    cnode.wait_active("nodeagent.service", timeout_s=300)
    assert f"localhost/nodeagent@{before}" in env_file.read_text()


@long_case
@pytest.mark.timeout(1200)
def test_a_broken_self_update_is_rolled_back_to_the_previous_digest(
    cnode: Node, built: Built, loaded: str, tmp_path: Path
) -> None:
    """The daemon's drop-in names a next image that exits at start (no entrypoint): the
    host's judge (nodeagent-image-health, started here as its timer would) sees the
    restarts, rejects the digest, removes the drop-in and the unit runs the previous one."""
    cnode.wait_active("nodeagent.service", timeout_s=300)
    private, _ = ed25519_key(tmp_path / "keys", "unused")
    broken = tiny_archive(tmp_path / "broken", private, version="0.0.0-broken")
    shutil.copy(broken.archive, cnode.root / "var/tmp/broken.oci.tar")
    podman = E2E_PODMAN.split()
    cnode.container.run(*podman, "load", "--quiet", "--input", "/var/tmp/broken.oci.tar")
    dropin = "/etc/systemd/system/nodeagent.service.d/50-self-update.conf"
    text = (
        "[Service]\n"
        f"Environment=NODEAGENT_IMAGE_NEXT={broken.digest}\n"
        f"Environment=NODEAGENT_IMAGE_NEXT_BASE={built.digest}\n"
    )
    (cnode.root / dropin.lstrip("/")).write_text(text)
    cnode.container.systemctl("daemon-reload")
    cnode.container.systemctl("restart", "--no-block", "nodeagent.service")
    env_file = cnode.container.live("/run/nodeagent/image.env")
    wait_for(
        lambda: broken.digest in env_file.read_text() or None,
        timeout_s=60,
        interval_s=0.2,
        what="the self-update selected",
    )
    restarts = int(cnode.show("nodeagent.service", "NRestarts")["NRestarts"])
    cnode.container.systemctl("start", "nodeagent-image-health.service")  # the trial begins
    wait_for(
        lambda: int(cnode.show("nodeagent.service", "NRestarts")["NRestarts"]) > restarts or None,
        timeout_s=120,
        interval_s=0.5,
        what="the broken image restarted",
        detail=lambda: cnode.unit_status("nodeagent.service"),
    )
    cnode.container.systemctl("start", "nodeagent-image-health.service")  # its next run
    lines = cnode.journal("-u", "nodeagent-image-health", "-u", "nodeagent-image-rollback")
    assert f"nodeagent_image_rolled_back: image={broken.digest}" in lines, lines
    assert not (cnode.root / dropin.lstrip("/")).exists()
    rejected = cnode.root / "var/lib/nodeagent/image/rejected"
    assert broken.digest in rejected.read_text()
    cnode.wait_active("nodeagent.service", timeout_s=300)
    env = cnode.container.live("/run/nodeagent/image.env").read_text()
    assert f"localhost/nodeagent@{built.digest}" in env


@long_case
@pytest.mark.timeout(600)
def test_the_rpm_units_counterparts_run_from_the_image(cnode: Node, loaded: str) -> None:
    """foreign-pins and mirror-dropin run the RPM units' commands from the daemon's image;
    the node mirror starts from systemd's socket through podman (LISTEN_FDS to PID 1 of
    its container) and answers on 127.0.0.1:22626."""
    cnode.wait_active("nodeagent.service", timeout_s=300)
    for unit in ("nodeagent-foreign-pins.service", "nodeagent-mirror-dropin.service"):
        cnode.container.run("systemctl", "start", unit, check=False, timeout_s=180)
        shown = cnode.show(unit, "Result", "ExecMainStatus")
        said = cnode.journal("-u", unit, "-n", "30", "-o", "cat")
        assert shown == {"Result": "success", "ExecMainStatus": "0"}, said
    asked = cnode.container.run(
        "bash", "-c",
        "exec 3<>/dev/tcp/127.0.0.1/22626; printf 'GET /v2/ HTTP/1.0\\r\\n\\r\\n' >&3;"
        " head -1 <&3",
        timeout_s=180,
    )  # fmt: skip
    # The mirror's own answer: it asks for the node mirror's credential (docs/mirror.md).
    assert re.match(r"HTTP/1\.[01] (200|401) ", asked.stdout), asked.stdout + asked.stderr
    assert cnode.show("nodeagent-mirror.service", "ActiveState")["ActiveState"] == "active"
    mirror = cnode.journal_entries("-u", "nodeagent-mirror.service")
    assert any(e.get("_SYSTEMD_UNIT") == "nodeagent-mirror.service" for e in mirror)


def test_the_node_root_carries_what_the_machine_config_installs(tmp_path: Path) -> None:
    """make test's sample of this module: the MachineConfig's files, units, drop-in and
    enablement land where the MCD writes them (no boot; the long cases boot this root)."""
    root = tmp_path / "root"
    config = machine_config()
    install_machine_config(root, config)
    units = root / "etc/systemd/system"
    assert "--sdnotify=container" in (units / "nodeagent.service").read_text()
    assert (units / "nodeagent.service.d/10-image.conf").exists()
    assert (units / "multi-user.target.wants/nodeagent.service").is_symlink()
    assert (units / "multi-user.target.wants/nodeagent-image-load.service").is_symlink()
    assert (units / "timers.target.wants/nodeagent-image-health.timer").is_symlink()
    loader = root / "usr/local/libexec/nodeagent/nodeagent-image-load"
    assert loader.stat().st_mode & 0o777 == 0o755
    assert (root / "etc/nodeagent/image-keys.d/agent-images.pem").exists()
