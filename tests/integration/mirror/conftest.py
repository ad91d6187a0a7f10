"""One offline node with every real piece of the node mirror, shared by the module's tests.

A registry holds four sleeper images (tests/testenv/pods.py): the pause image, an app pinned
by digest, a catalog whose tag a ``--serve-tags`` bundle signs, and an image to evict, plus a
synthetic release with its OS image (tests/testenv/release.py). Two bundles are made of
them, the registry is stopped, both are imported into the real CRI-O (``bundle import``: the
import's loopback mirror is gone when it returns). Then the real daemon starts, writes its
real registries.conf drop-in (``98-nodeagent-node-mirror.conf``) and reloads CRI-O, and the
real ``nodeagent serve-mirror`` process serves the node mirror on a free loopback port,
unprivileged as its unit runs it (another uid, no capability, the store read-only). Every
pull below goes through CRI-O's or the container tools' reading of that drop-in.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles import minisign
from nodeagent.bundles.manifest import parse_manifest
from nodeagent.config import NODE_MIRROR_DROPIN_NAME
from tests.capabilities import skip_unless
from tests.integration.bundles.test_create_verify import make_keys, run_cli
from tests.testenv import pods
from tests.testenv.agent import Agent
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.images import push
from tests.testenv.packages import PACKAGES, ensure_packages
from tests.testenv.peer_process import PEER_UID, agent_peer_command, share_with_peer
from tests.testenv.private_containers import PrivateContainers
from tests.testenv.registry import Registry, free_port
from tests.testenv.release import SyntheticRelease, push_release
from tests.testenv.waiting import log_tail, wait_for

CATALOG = "nodeagent-test/catalog"
TAG = "v4.16"
TAG_ONLY = 'pull-from-mirror = "tag-only"'


@dataclass
class OfflineNode:
    registry: Registry
    """Stopped: started again only by the test that kills the node mirror."""
    crio: Crio
    agent: Agent
    mirror_port: int
    pause: str
    app: str
    """Pinned by digest."""
    evicted: str
    """Carried by the bundle, so stored, but in no set: not pinned (the kubelet's garbage
    collection may remove it); removed from CRI-O's storage by the tests."""
    tag_ref: str
    signed_digest: str
    release: SyntheticRelease
    work: Path
    peer: subprocess.Popen[bytes] | None = None
    peer_log: Path | None = None

    @property
    def mirror_host(self) -> str:
        return f"127.0.0.1:{self.mirror_port}"

    def mirror_log(self) -> str:
        return "" if self.peer_log is None else self.peer_log.read_text(errors="replace")

    def start_mirror(self) -> None:
        """``nodeagent serve-mirror`` as its unit starts it once the daemon listens: another
        uid, no capability, the store read-only, the rest of the state hidden
        (``peer_process.agent_peer_command``)."""
        self.agent.wait_log("peer_reports_listening")
        self.peer_log = self.work / "peer.log"
        argv = [sys.executable, "-m", "nodeagent", "--config", str(self.agent.config_file)]
        command = agent_peer_command(self.agent.base, self.agent.state_dir, [*argv, "serve-mirror"])
        with self.peer_log.open("ab") as log:
            self.peer = subprocess.Popen(
                command, stdout=log, stderr=log, env=self.agent.env(), cwd="/"
            )
        log_path = self.peer_log
        wait_for(
            lambda: "node_mirror_started" in log_path.read_text(errors="replace"),
            timeout_s=30,
            what="the node mirror to listen",
            detail=lambda: log_tail(log_path),
        )
        status = Path(f"/proc/{self.peer.pid}/status").read_text()
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert uids == [str(PEER_UID)] * 4  # the unprivileged peer, as its unit runs it

    def kill_mirror(self) -> None:
        if self.peer is not None and self.peer.poll() is None:
            self.peer.send_signal(signal.SIGKILL)
            self.peer.wait(timeout=30)

    def tools(self, name: str) -> PrivateContainers:
        """podman and skopeo on CRI-O's storage and CRI-O's registries files (its
        registries.conf and registries.conf.d, the daemon's drop-in among them)."""
        tools = PrivateContainers(self.work / name, self.crio.storage_conf)
        shutil.copy(self.crio.registries_conf, tools.etc / "registries.conf")
        shutil.rmtree(tools.etc / "registries.conf.d", ignore_errors=True)
        shutil.copytree(self.crio.registries_dir, tools.etc / "registries.conf.d")
        return tools

    @property
    def dropin(self) -> Path:
        return self.crio.registries_dir / NODE_MIRROR_DROPIN_NAME


def _bundles(work: Path, registry: Registry) -> tuple[dict[str, str], SyntheticRelease, Path]:
    """The images bundle (``--serve-tags``) and the release bundle; the registry stopped."""
    built = {n: pods.sleeper_image(work / n, label=n) for n in ("pause", "app", "cat", "spare")}
    public, secret = minisign.generate_keypair(comment="node mirror e2e")
    keys = make_keys(work / "release-keys", "release")
    with registry:
        host = registry.host
        refs = {
            "pause": push(registry.url, "nodeagent-test/pause", built["pause"]).reference(host),
            "app": push(registry.url, "nodeagent-test/app", built["app"]).reference(host),
            "evicted": push(registry.url, "nodeagent-test/spare", built["spare"]).reference(host),
        }
        catalog = push(registry.url, CATALOG, built["cat"], tag=TAG)
        refs["catalog"] = catalog.reference(host)
        refs["signed"] = catalog.digest
        images = [
            refs["pause"],
            refs["app"],
            refs["evicted"],
            f"{host}/{CATALOG}:{TAG}@{catalog.digest}",
        ]
        in_sets = [refs["pause"], refs["app"], refs["catalog"]]
        # the tagged one newer in the same channel (a rollback is refused)
        for name, flags in (("plain", []), ("images", ["--serve-tags"])):
            (work / name).mkdir()
            make_bundle(
                work / name, registry, in_sets, public, secret,
                images=images if flags else [*in_sets, refs["evicted"]],
                extra_args=[*flags, "--sequence", "2" if flags else "1"],
                bundle_id=f"{name}-e2e", set_name=f"{name}-e2e",
            )  # fmt: skip
        release = push_release(
            registry.url, host, work, version="4.99.7", payload_count=1, os_image=True
        )
        created = run_cli(
            "bundle", "create", "--release", release.ref, "--key", keys.key, "--output",
            work / "release-bundle", "--insecure-registry", host, "--arch", "amd64",
            "--id", "node-mirror-e2e",
        )  # fmt: skip
        assert created.code == 0, created.err
    (work / "trusted").mkdir()
    (work / "trusted" / "images.pub").write_text(public)
    shutil.copy(keys.pub, work / "trusted" / "release.pub")
    return refs, release, work / "images" / "bundle"


@pytest.fixture(scope="module")
def offline_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineNode]:
    skip_unless("pods")
    ensure_packages({name: PACKAGES[name] for name in ("podman", "skopeo")})
    work = tmp_path_factory.mktemp("node-mirror-e2e")
    registry = Registry(work / "registry")
    refs, release, images_bundle = _bundles(work, registry)
    host = registry.host
    runtime = pods.PodRuntime(pause_image=refs["pause"])
    with Crio(work / "crio", insecure_registries=[host], pods=runtime) as crio:
        port = free_port()
        agent = Agent(work / "agent", crio, extra_config=f'[mirror]\nlisten = "127.0.0.1:{port}"\n')
        agent.write_config()
        for shared in (agent.state_dir / "store", agent.run_dir / "peer"):
            share_with_peer(shared)  # as the package's tmpfiles entries leave them
        agent.trusted_keys_dir.mkdir(parents=True)
        for key in (work / "trusted").iterdir():
            shutil.copy(key, agent.trusted_keys_dir / key.name)
        for bundle in (work / "plain" / "bundle", work / "release-bundle"):
            done = agent.cli("bundle", "import", str(bundle), "--json")
            assert done.returncode == 0, done.stdout + done.stderr
        node = OfflineNode(
            registry, crio, agent, port, refs["pause"], refs["app"], refs["evicted"],
            f"{host}/{CATALOG}:{TAG}", refs["signed"], release, work,
        )  # fmt: skip
        with agent:
            wait_for(node.dropin.exists, timeout_s=30, what="the daemon's drop-in")
            agent.wait_log("mirror_dropin_applied")  # CRI-O reloaded with it
            assert TAG_ONLY not in node.dropin.read_text()  # no bundle serves a tag yet
            # The same images, now with a served tag, reach the store while the daemon runs
            # (as a site fetch stores them; a by-hand import is refused beside the daemon,
            # DaemonRunning): the store's index.json does not change, the drop-in must
            # follow all the same.
            manifest = parse_manifest((images_bundle / "bundle.json").read_bytes())
            copy_bundle(agent.state_dir / "store", images_bundle, manifest,
                        agent.trusted_keys_dir)  # fmt: skip
            wait_for(
                lambda: TAG_ONLY in node.dropin.read_text(), timeout_s=30,
                what="the daemon's drop-in to send the served tag to the node mirror",
            )  # fmt: skip
            wait_for(
                lambda: agent.log_text().count("mirror_dropin_applied") == 2, timeout_s=30,
                what="CRI-O reloaded with the tag-only entry",
            )  # fmt: skip
            node.start_mirror()
            try:
                yield node
            finally:
                node.kill_mirror()
