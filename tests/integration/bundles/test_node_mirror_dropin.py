"""The node mirror's registries.conf drop-in against the real consumers (decision 0058).

registries.conf is what the machine-config operator renders from an ImageDigestMirrorSet
(``NeverContactSource``: the source ``blocked``, a site mirror ``digest-only``), from an
ImageContentSourcePolicy (``mirror-by-digest-only``) and an ``insecure`` entry. The store's
``index.json`` names two images of the source; the source registry is down (nothing listens
on its address). The node mirror is played by Debian's docker-registry serving the same
blobs on ``[mirror] listen``; the site mirror by another. nodeagent renders the drop-in
(``render-mirror-dropin --write --reload``), then:

* CRI-O reloads with it and pulls through the node mirror (first), then, the node mirror
  stopped, through the site mirror (second): both mirrors, in that order, the source never;
* Debian's skopeo and podman, reading the same files (a private mount namespace puts the
  test's directory on /etc/containers), pull the same digests through it;
* a malformed file of another component (both mirror forms in one entry) is refused by
  skopeo and by nodeagent alike: ``RegistriesConfInvalid``, exit 78, no file written;
* the daemon re-renders the drop-in when another drop-in changes, and removes it (CRI-O
  reloaded) with ``[mirror] enabled = false``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.config import NODE_MIRROR_DROPIN_NAME
from nodeagent.registries import Mirror, read_registries_conf
from nodeagent.store import layout
from nodeagent.store.layout import StoredImage
from tests.conftest import Pushed
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry, free_port
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[3]
RELOADED = "Configuration reload completed"


def idms_registries_conf(dead: str, site: str) -> str:
    """What MCO renders: IDMS (blocked source, digest-only mirror), ICSP, an insecure entry."""
    return f"""unqualified-search-registries = []
short-name-mode = "disabled"

[[registry]]
prefix = "{dead}/nodeagent-test/app-a"
location = "{dead}/nodeagent-test/app-a"
blocked = true

[[registry.mirror]]
location = "{site}/nodeagent-test/app-a"
insecure = true
pull-from-mirror = "digest-only"

[[registry]]
prefix = ""
location = "{dead}/nodeagent-test/app-b"
mirror-by-digest-only = true

[[registry.mirror]]
location = "{site}/nodeagent-test/app-b"
insecure = true

[[registry]]
location = "insecure.example:5000"
insecure = true
"""


def write_index(agent: Agent, refs: list[str]) -> None:
    store = agent.state_dir / "store"
    store.mkdir(parents=True, exist_ok=True)
    digest = "sha256:" + "0" * 64
    images = [StoredImage(ref, digest, 1, layout.INDEX_MEDIA_TYPE) for ref in refs]
    (store / layout.INDEX_NAME).write_bytes(layout.render_index(images))


def served(registry: Registry, repository: str) -> int:
    """Manifest GETs ``registry`` answered 200 for ``repository``."""
    lines = registry.log_path.read_text(errors="replace").splitlines()
    wanted = f"/v2/{repository}/manifests/"
    return sum(1 for line in lines if wanted in line and 'HTTP/1.1" 200 ' in line)


def with_etc(etc: Path, home: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` with ``etc`` on /etc/containers and ``home`` on /mnt (podman wants a short
    runroot) in a private mount namespace: the host's files are neither read nor written."""
    script = 'mount --bind "$0" /etc/containers && mount --bind "$HOME" /mnt && exec "$@"'
    env = dict(os.environ, HOME=str(home))
    env.pop("CONTAINERS_REGISTRIES_CONF", None)
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(etc), *command],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def consumer_etc(crio: Crio, base: Path) -> Path:
    """A copy of CRI-O's registries.conf, its drop-ins and policy.json: the same files."""
    etc = base / "containers-etc"
    shutil.rmtree(etc, ignore_errors=True)
    etc.mkdir(parents=True)
    shutil.copy(crio.registries_conf, etc / "registries.conf")
    shutil.copytree(crio.registries_dir, etc / "registries.conf.d")
    shutil.copy(crio.etc / "policy.json", etc / "policy.json")
    return etc


@dataclass
class Node:
    crio: Crio
    agent: Agent
    node: Registry
    site: Registry
    dead: str
    refs: list[str]

    @property
    def dropin(self) -> Path:
        return self.crio.registries_dir / NODE_MIRROR_DROPIN_NAME


@pytest.fixture
def rendered(registry: Registry, pushed: Pushed, tmp_path: Path) -> Iterator[Node]:
    """CRI-O beside an IDMS-rendered registries.conf, the source down, the node and site
    mirrors up, the drop-in rendered by ``render-mirror-dropin --write --reload``."""
    dead = f"127.0.0.1:{free_port()}"
    refs = [pushed.base_a.reference(dead), pushed.base_b.reference(dead)]
    with (
        Registry(tmp_path / "node-mirror", storage_root=registry.root) as node,
        Registry(tmp_path / "site-mirror", storage_root=registry.root) as site,
        Crio(tmp_path / "crio") as crio,
    ):
        crio.registries_conf.write_text(idms_registries_conf(dead, site.host))
        crio.reload()
        config = f'[mirror]\nlisten = "{node.host}"\n'
        agent = Agent(tmp_path / "agent", crio, extra_config=config)
        agent.write_config()
        write_index(agent, refs)
        done = agent.cli("render-mirror-dropin", "--write", "--reload")
        assert done.returncode == 0, done.stderr
        assert "wrote:" in done.stdout
        blocked = f"no fallback: the source of {dead}/nodeagent-test/app-a is blocked"
        assert blocked in done.stdout
        yield Node(crio, agent, node, site, dead, refs)


async def test_crio_pulls_through_the_node_mirror_first_then_the_site_mirror_never_the_source(
    rendered: Node,
) -> None:
    n, (ref_a, _ref_b) = rendered, rendered.refs
    assert stat.S_IMODE(n.dropin.stat().st_mode) == 0o644
    again = n.agent.cli("render-mirror-dropin", "--write", "--reload")
    assert "unchanged:" in again.stdout  # no rewrite, no reload
    conf = read_registries_conf(
        [("registries.conf", n.crio.registries_conf.read_text()),
         (n.dropin.name, n.dropin.read_text())]
    )  # fmt: skip
    entries = {e.key: e for e in conf.entries}
    a = entries[f"{n.dead}/nodeagent-test/app-a"]
    assert a.is_blocked and a.mirrors == (
        Mirror(f"{n.node.host}/nodeagent-test/app-a", True, "digest-only"),
        Mirror(f"{n.site.host}/nodeagent-test/app-a", True, "digest-only"),
    )
    b = entries[f"{n.dead}/nodeagent-test/app-b"]
    assert not b.is_mirror_by_digest_only  # ICSP's form turned per-mirror
    assert b.mirrors[1] == Mirror(f"{n.site.host}/nodeagent-test/app-b", True, "digest-only")
    assert entries["insecure.example:5000"].is_insecure  # untouched, still applies

    n.crio.reload()  # raises if CRI-O refuses the files
    async with CriClient(n.crio.endpoint, timeout_s=60) as cri:
        await cri.pull_image(ref_a, timeout_s=120)
        assert served(n.node, "nodeagent-test/app-a") >= 1  # ours first
        assert served(n.site, "nodeagent-test/app-a") == 0
        await cri.remove_image(ref_a)
        n.node.stop()
        await cri.pull_image(ref_a, timeout_s=120)  # the site mirror, second
        assert served(n.site, "nodeagent-test/app-a") >= 1


@pytest.mark.needs("skopeo")
async def test_skopeo_and_podman_pull_through_the_same_files(
    rendered: Node, tmp_path: Path
) -> None:
    n, (ref_a, ref_b) = rendered, rendered.refs
    etc, home = consumer_etc(n.crio, tmp_path), tmp_path / "home"
    home.mkdir()
    inspected = with_etc(etc, home, "skopeo", "inspect", "--raw", f"docker://{ref_b}")
    assert inspected.returncode == 0, inspected.stderr
    assert served(n.node, "nodeagent-test/app-b") >= 1
    pulled = with_etc(
        etc, home, "podman", "--root", "/mnt/root", "--runroot", "/mnt/run",
        "--storage-driver", "vfs", "--events-backend", "none", "pull", "-q", ref_a,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    assert served(n.node, "nodeagent-test/app-a") >= 1
    assert served(n.site, "nodeagent-test/app-a") == 0


@pytest.mark.needs("skopeo")
async def test_a_malformed_drop_in_is_refused_by_skopeo_and_nodeagent_and_left_untouched(
    rendered: Node, pushed: Pushed, tmp_path: Path
) -> None:
    n = rendered
    written = n.dropin.read_bytes()
    broken = n.crio.registries_dir / "50-broken.conf"
    broken_text = (
        f'[[registry]]\nlocation = "{n.dead}/other"\nmirror-by-digest-only = true\n'
        f'[[registry.mirror]]\nlocation = "{n.site.host}/other"\n'
        'pull-from-mirror = "digest-only"\n'
    )
    broken.write_text(broken_text)
    write_index(n.agent, [*n.refs, pushed.multiarch.reference(n.dead)])  # holdings change
    home = tmp_path / "home"
    home.mkdir()
    refused = with_etc(
        consumer_etc(n.crio, tmp_path), home, "skopeo", "inspect", "--raw",
        f"docker://{n.refs[1]}",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "mirror-by-digest-only" in refused.stderr
    done = n.agent.cli("render-mirror-dropin", "--write", "--reload")
    assert done.returncode == 78
    assert "RegistriesConfInvalid: 50-broken.conf" in done.stderr
    assert n.dropin.read_bytes() == written  # ours not rewritten
    assert broken.read_text() == broken_text  # theirs untouched


def unit_command() -> list[str]:
    """The path unit's service's command, without the launcher's path."""
    unit = (REPO / "systemd" / "nodeagent-mirror-dropin.service").read_text()
    found = re.search(r"^ExecStart=/usr/bin/nodeagent (.+)$", unit, re.MULTILINE)
    assert found is not None
    return found.group(1).split()


def test_the_path_units_command_follows_registries_conf_while_the_daemon_is_stopped(
    rendered: Node,
) -> None:
    """An MCO update to registries.conf while nodeagent is stopped: the oneshot the path unit
    starts restates the new entry and reloads CRI-O once; run again, it changes nothing."""
    n = rendered
    conf = n.crio.registries_conf
    conf.write_text(
        conf.read_text().replace(
            'pull-from-mirror = "digest-only"\n',
            'pull-from-mirror = "digest-only"\n\n[[registry.mirror]]\n'
            'location = "second.site/nodeagent-test/app-a"\npull-from-mirror = "digest-only"\n',
            1,
        )
    )
    reloads = n.crio.log_path.read_text(errors="replace").count(RELOADED)
    done = n.agent.cli(*unit_command())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote:") and "reloaded crio.service" in done.stdout
    assert "second.site/nodeagent-test/app-a" in n.dropin.read_text()
    wait_for(
        lambda: n.crio.log_path.read_text(errors="replace").count(RELOADED) > reloads,
        timeout_s=30,
        what="CRI-O reloaded by the oneshot",
    )
    again = n.agent.cli(*unit_command())
    assert again.stdout.startswith("unchanged:") and "reloaded" not in again.stdout


async def test_the_daemon_follows_other_drop_ins_and_removes_its_own_when_disabled(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref_a = pushed.base_a.reference(dead)
    listen = f'[mirror]\nlisten = "127.0.0.1:{free_port()}"\n'
    with Crio(tmp_path / "crio") as crio:
        agent = Agent(tmp_path / "agent", crio, extra_config=listen)
        agent.write_config()
        write_index(agent, [ref_a])
        dropin = crio.registries_dir / NODE_MIRROR_DROPIN_NAME
        with agent:
            wait_for(dropin.exists, timeout_s=30, what="the drop-in written at start")
            agent.wait_status(
                lambda st: any(
                    c["type"] == "MirrorDropin" and c["reason"] == "Current"
                    for c in st["conditions"]
                ),
                what="the status file's MirrorDropin condition",
            )
            namespace = f"{dead}/nodeagent-test"
            (crio.registries_dir / "60-site.conf").write_text(
                f'[[registry]]\nprefix = "{namespace}"\nlocation = "{namespace}"\n'
                '[[registry.mirror]]\nlocation = "late-mirror.site/nt"\n'
            )
            wait_for(
                lambda: "late-mirror.site/nt/app-a" in dropin.read_text(),
                timeout_s=30,
                what="the drop-in to restate the other drop-in's new mirror",
            )
            # CRI-O was reloaded once per change: at start, and after this one.
            wait_for(
                lambda: agent.log_text().count("mirror_dropin_applied") == 2,
                timeout_s=30,
                what="CRI-O reloaded after the re-render",
            )
            crio.reload()  # and it accepts the merged files
        agent.extra_config = listen.replace("[mirror]\n", "[mirror]\nenabled = false\n")
        agent.write_config()
        with agent:
            wait_for(lambda: not dropin.exists(), timeout_s=30, what="the drop-in removed")
            wait_for(
                lambda: (
                    "mirror_dropin_removed" in agent.log_text()
                    and agent.log_text().count("mirror_dropin_applied") == 3
                ),
                timeout_s=30,
                what="CRI-O reloaded after the removal",
            )
