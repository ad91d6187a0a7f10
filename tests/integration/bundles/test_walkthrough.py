"""docs/operations.md's walk-throughs, run: the technician's (plug, watch, pull, read) and the
admin's, against the real daemon, systemd-udevd with a loop-device stick, CRI-O and the
kube-apiserver (issue 28, "Done when"; decision 0073).

The document marks each block a reader sees with ``<!-- walkthrough: NAME -->`` on the line
before its fence. In a block, ``$ `` lines are what the reader types; every other line is a
line the reader will see. After normalising what varies from run to run (times, digests,
sizes, rates, durations, paths of this test's root, process ids), each block's lines must
appear in what the step printed, in the same order (``status`` and the site view: every
line; the journal: its lines among the daemon's others). A reworded message, a changed
verdict or a step that no longer prints what the document shows fails here.
About 25 s (the factory, the daemon in cluster mode, the stick, two admin commands).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testenv.agent import Agent, set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import cluster_config, install_deploy
from tests.testenv.udev import Udevd, settle

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "operations.md"
NODE = "edge-1"
BUNDLE, SET = "line-3-2026-11", "line-3"
MARK = re.compile(r"^<!-- walkthrough: ([a-z-]+) -->\n```[a-z]*\n(.*?)^```$", re.M | re.S)

_VARIABLE = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"), "<time>"),
    (re.compile(r"sha256:[0-9a-f]{64}"), "sha256:<digest>"),
    (re.compile(r"\b[0-9A-Fa-f]{16}\b"), "<keyid>"),
    (re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|kB|MB|GB)(?:/s)?\b"), "<size>"),
    (re.compile(r"\d+(?:\.\d+)? ?(?:s|ms|min|h)\b"), "<duration>"),
    (re.compile(r"\b\d+(?:\.\d+)? (?:MB/s)"), "<rate>"),
    (re.compile(r"seconds=\d+(?:\.\d+)?"), "seconds=<n>"),
    (re.compile(r"(?:/dev/)?loop\d+"), "<stick>"),
    (re.compile(r"/dev/sd[a-z]\d*"), "<stick>"),
    (re.compile(r"process \d+"), "process <pid>"),
]


def normalise(line: str, root: Path) -> str:
    line = line.replace(str(root), "<root>").rstrip()
    for pattern, placeholder in _VARIABLE:
        line = pattern.sub(placeholder, line)
    return re.sub(r"\s+", " ", line)


def blocks() -> dict[str, list[str]]:
    """Walk-through block name -> the lines the reader sees (commands left out)."""
    found = {name: body.splitlines() for name, body in MARK.findall(DOC.read_text("utf-8"))}
    return {
        name: [x for x in lines if x and not x.startswith("$ ")] for name, lines in found.items()
    }


def check(name: str, printed: str, root: Path, *, whole: bool) -> None:
    """The block's lines, normalised, in ``printed`` in order (``whole``: nothing else)."""
    expected = [normalise(x, root) for x in blocks()[name]]
    seen = [normalise(x, root) for x in printed.splitlines() if x.strip()]
    if whole:
        assert seen == expected, f"{name}:\n" + "\n".join(seen)
        return
    at = 0
    for line in expected:
        assert line in seen[at:], f"{name}: {line!r} not found in order in:\n" + "\n".join(seen)
        at = seen.index(line, at) + 1


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    return build_factory(
        tmp_path_factory.mktemp("factory"), count=2, layer_bytes=1 << 20, seed=2811,
        bundle_id=BUNDLE, set_name=SET,
    )  # fmt: skip


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


def _pinned(status: dict[str, Any]) -> bool:
    ours = [b for b in status.get("bundles", []) if b.get("bundleId") == BUNDLE]
    return bool(ours) and ours[-1]["state"] == "pinned" and set_state(status, SET) == "Pinned"


def test_the_documented_walk_throughs_are_what_the_technician_and_the_admin_see(
    udevd: Udevd, factory: Factory, fresh_crio: Crio, kube: KubeCluster, tmp_path: Path
) -> None:
    install_deploy(kube)
    kube.kubectl("delete", "nis,nodeimageholdings", NODE, "--ignore-not-found")
    kube.create_node(NODE, labels={"site": "plant-7", "node-role.kubernetes.io/worker": ""})
    media = ext4_media(tmp_path, factory.bundle)
    agent = Agent(
        tmp_path / "agent", fresh_crio, watch_media=True, extra_config=cluster_config(kube, NODE)
    )
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(factory.public_key)
    try:
        with agent:
            agent.wait_log("cluster_sets_changed")
            media.attach()  # plug
            agent.wait_status(_pinned, what="the stick's bundle imported and pinned")
            shown = agent.cli("status")  # watch (its last picture)
            assert shown.returncode == 0, shown.stderr
            media.unplug()  # pull
            settle()
            agent.wait_log("bundle_media_removed")
            journal = agent.current_run_log()  # read
            admin = ("--kubeconfig", str(kube.admin_kubeconfig), "--selector", "site=plant-7")
            site = agent.cli("site", "status", "--bundle", BUNDLE, *admin)
            wait = agent.cli("site", "wait", "--bundle", BUNDLE, "--timeout", "60", *admin)
        assert set(blocks()) >= {"technician-status", "technician-journal", "admin-site"}
        check("technician-status", shown.stdout, agent.base, whole=False)
        check("technician-journal", journal, agent.base, whole=False)
        assert site.returncode == 0 and wait.returncode == 0, site.stderr + wait.stderr
        said = site.stdout + site.stderr + wait.stdout + wait.stderr  # as a terminal shows it
        check("admin-site", said, agent.base, whole=True)
    finally:
        if media.devnode is not None:
            subprocess.run(["umount", "--lazy", media.devnode], check=False)
            media.detach()
        kube.kubectl("delete", "node", NODE, "--ignore-not-found")
        kube.kubectl("delete", "nis,nodeimageholdings", NODE, "--ignore-not-found")
