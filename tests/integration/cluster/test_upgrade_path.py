"""Issue 26 items 1 to 3 end to end: a release bundle, a real daemon, the real kube-apiserver.

The factory makes a release bundle with ``--from-version`` (the test registry, a synthetic
release whose release-metadata lists 4.99.0 in ``previous``); a node in cluster mode (CRI-O,
its own identity and deploy/'s RBAC) imports it, pins its set, reads ClusterVersion (the CVO
stand-in with openshift/api's CRD) and publishes ``status.releases``; the upgrade gate of
deploy/upgrade-gate.yaml then decides with that object as its param:

* the cluster at 4.99.0: the release is an upgrade, pinned; a target of its digest passes
  once every NodeImageStatus lists it pinned, and is refused while a second node's does not;
* the cluster at 4.98.0: the same release is reported ``ReleaseNotAnUpgrade`` with both
  versions (status.releases, judged again when ClusterVersion changes), still pinned.

About 25 s (the registry, the bundle, the import and the daemon's start).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.bundles.test_create_verify import Keys, make_keys, run_cli
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.cvo import CvoStandIn, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, cluster_config, get, install_deploy
from tests.testenv.registry import Registry
from tests.testenv.release import SyntheticRelease, push_release
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

VERSION = "4.99.1"
NODE = "edge-up-1"
OTHER = "edge-up-2"
GATE = DEPLOY / "upgrade-gate.yaml"


@dataclass(frozen=True)
class Made:
    release: SyntheticRelease
    keys: Keys
    bundle: Path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    work = tmp_path_factory.mktemp("release")
    with Registry(work / "registry") as registry:
        release = push_release(
            registry.url, registry.host, work, version=VERSION, payload_count=2,
            previous=["4.98.5", "4.99.0"],
        )  # fmt: skip
        keys = make_keys(work / "keys")
        bundle = work / "bundle"
        created = run_cli(
            "bundle", "create", "--release", release.ref, "--key", keys.key, "--output", bundle,
            "--insecure-registry", registry.host, "--arch", "amd64", "--id", "ocp-4.99.1",
            "--from-version", "4.99.0",
        )  # fmt: skip
        assert created.code == 0, created.err
        yield Made(release, keys, bundle)


def releases_of(kube: KubeCluster, node: str) -> list[dict[str, Any]]:
    nis = get(kube, "nodeimagestatuses", node) or {}
    found: list[dict[str, Any]] = (nis.get("status") or {}).get("releases") or []
    return found


def set_target(kube: KubeCluster, digest: str) -> Any:
    patch = json.dumps({"spec": {"desiredUpdate": {"image": release_image(digest)}}})
    return kube.kubectl("patch", "clusterversion", "version", "--type=merge", "-p", patch)


@pytest.mark.timeout(240)
def test_a_pinned_release_opens_the_gate_and_a_wrong_one_is_said(
    kube: KubeCluster, made: Made, fresh_crio: Crio, tmp_path: Path
) -> None:
    install_deploy(kube)
    install_crd(kube)
    cvo = CvoStandIn(kube)
    cvo.install("4.99.0", release_image("sha256:" + "0" * 64))
    kube.create_node(NODE)
    kube.kubectl_ok("apply", "--server-side", "-f", str(GATE))
    digest = made.release.digest
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=cluster_config(kube, NODE))
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    shutil.copy(made.keys.pub, agent.trusted_keys_dir / "factory.pub")
    try:
        imported = agent.cli("bundle", "import", str(made.bundle), "--json")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        with agent:
            expected = {"digest": digest, "version": VERSION, "set": f"release-{VERSION}",
                        "pinned": True}  # fmt: skip
            wait_for(
                lambda: releases_of(kube, NODE) == [expected],
                timeout_s=90,
                what="the node's NodeImageStatus listing the release pinned",
            )
            # A second node that holds it unpinned: the gate names it.
            kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps({
                "apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeImageStatus",
                "metadata": {"name": OTHER}, "spec": {"nodeName": OTHER}}))  # fmt: skip
            other = json.loads(kube.kubectl_ok("get", "nis", OTHER, "-o", "json"))
            other["status"] = {"releases": [expected | {"pinned": False}]}
            kube.kubectl_ok("replace", "--subresource=status", "-f", "-", input=json.dumps(other))
            wait_for(
                lambda: f"node {OTHER} has not pinned" in set_target(kube, digest).stderr,
                timeout_s=30,
                what="the gate refusing the target, naming the other node",
            )
            kube.kubectl_ok("delete", "nis", OTHER)
            wait_for(
                lambda: set_target(kube, digest).returncode == 0,
                timeout_s=30,
                what="the gate letting the target every node pinned pass",
            )
            assert cvo.get()["spec"]["desiredUpdate"]["image"] == release_image(digest)
            wait_for(
                lambda: "upgrade_target_pinned" in agent.current_run_log(),
                timeout_s=30,
                what="the node saying it pinned the cluster's target",
            )
            assert "upgrade_target_not_pinned" not in agent.current_run_log()

            # The cluster is at 4.98.0 instead: the release does not list it.
            cvo.install("4.98.0", release_image("sha256:" + "9" * 64))
            wait_for(
                lambda: releases_of(kube, NODE)[0].get("reason") == "ReleaseNotAnUpgrade",
                timeout_s=60,
                what="the release judged again against the cluster's new version",
            )
            entry = releases_of(kube, NODE)[0]
            assert entry["pinned"] is True  # loaded and pinned all the same
            assert "4.98.0" in entry["message"] and VERSION in entry["message"]
            # and the journal says it, once, with both versions (it was said at import only)
            wait_for(
                lambda: "release_not_an_upgrade" in agent.current_run_log(), timeout_s=30,
                what="the journal line of the new verdict",
            )  # fmt: skip
            said = [line for line in agent.current_run_log().splitlines()
                    if "release_not_an_upgrade" in line]  # fmt: skip
            assert len(said) == 1 and "cluster_version=4.98.0" in said[0], said
    finally:
        kube.kubectl("delete", "--ignore-not-found", "-f", str(GATE))
        kube.kubectl("delete", "--ignore-not-found", "nis", NODE, OTHER)
        kube.kubectl("delete", "--ignore-not-found", "node", NODE)
        kube.kubectl("delete", "--ignore-not-found", "clusterversion", "version")
