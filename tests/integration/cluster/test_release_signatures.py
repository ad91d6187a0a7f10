"""A release bundle's signatures given to the CVO by the node, against the real kube-apiserver.

With the node's own identity (system:node:<name>, group system:nodes) and only deploy/rbac.yaml,
the write is refused and the journal says how to do it by hand; once an administrator applies
the opt-in deploy/opt-in/release-signatures.yaml (its RBAC and admission policy), the same
publisher creates the ConfigMap, and the signature in it verifies with the test key over the
release digest. tests/security/test_node_configmaps.py tries what else a node could write there.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from nodeagent.adapters.bundles.release import ConfigMaps, StoredSignatures
from nodeagent.adapters.kube import KubeApi
from nodeagent.bundles.release_signatures import SignaturePublisher
from nodeagent.cluster.objects import FIELD_MANAGER
from tests.integration.bundles.test_create_verify import make_keys, run_cli
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, get, install_deploy
from tests.testenv.registry import Registry
from tests.testenv.release import (
    SyntheticRelease,
    TestGpg,
    push_release,
    signature_document,
    verify_signature,
    write_signature_store,
)
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration

BUNDLE_ID = "release-cluster-test"
NAMESPACE = "openshift-config-managed"


@dataclass(frozen=True)
class Stored:
    release: SyntheticRelease
    gpg: TestGpg
    store_dir: Path
    trusted_dir: Path
    work: Path


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    """A signed release bundle, then its node-store directory (manifest, signature, files)."""
    work = tmp_path_factory.mktemp("release-cluster")
    gpg = TestGpg.make(work / "gnupg")
    keys = make_keys(work / "keys")
    with Registry(work / "registry") as registry:
        release = push_release(registry.url, registry.host, work, version="4.99.2", payload_count=2)
        store = write_signature_store(
            work / "sigs", release.digest, [gpg.sign(signature_document(release))]
        )
        made = run_cli(
            "bundle", "create", "--release", release.ref, "--signature-dir", store,
            "--key", keys.key, "--output", work / "bundle", "--id", BUNDLE_ID,
            "--arch", "amd64", "--insecure-registry", registry.host,
        )  # fmt: skip
        assert made.code == 0, made.err
    own = work / "store" / "bundles" / BUNDLE_ID
    own.mkdir(parents=True)
    for name in ("bundle.json", "bundle.json.minisig"):
        shutil.copy(work / "bundle" / name, own / name)
    shutil.copytree(work / "bundle" / "release-signatures", own / "release-signatures")
    yield Stored(release, gpg, work / "store", keys.trusted_dir, work)
    gpg.close()


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    kube.kubectl("create", "namespace", NAMESPACE)
    return kube


async def test_applied_by_the_node_only_with_the_opt_in_rbac(
    cluster: KubeCluster, stored: Stored
) -> None:
    api = KubeApi(cluster.kubeconfig_for_node("node-r"), timeout_s=10, field_manager=FIELD_MANAGER)
    publisher = SignaturePublisher(
        StoredSignatures(stored.store_dir, stored.trusted_dir), ConfigMaps(api)
    )
    try:
        with structlog.testing.capture_logs() as logs:
            assert not await publisher.publish(BUNDLE_ID)
        (refused,) = logs
        assert (refused["event"], refused["reason"]) == (
            "release_signatures_not_applied",
            "ApiAccessDenied",
        )
        assert f"nodeagent bundle release-signatures {BUNDLE_ID}" in refused["action"]

        cluster.kubectl_ok(
            "apply", "--server-side", "-f", str(DEPLOY / "opt-in" / "release-signatures.yaml")
        )

        async def applied() -> bool | None:
            return await publisher.publish(BUNDLE_ID) or None  # RBAC takes effect at once or soon

        await wait_for_async(applied, timeout_s=30, interval_s=0.5, what="ConfigMap applied")
    finally:
        await api.close()
    hex_part = stored.release.digest.removeprefix("sha256:")
    found = get(cluster, "configmap", f"sha256-{hex_part}", NAMESPACE)
    assert found is not None
    assert found["metadata"]["labels"] == {"release.openshift.io/verification-signatures": ""}
    managers = {entry["manager"] for entry in found["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers
    assert list(found["binaryData"]) == [f"sha256-{hex_part}-1"]
    signature = base64.b64decode(found["binaryData"][f"sha256-{hex_part}-1"])
    signed = verify_signature(signature, stored.gpg.public_keyring, stored.work / "gpgv")
    assert signed["critical"]["image"]["docker-manifest-digest"] == stored.release.digest
    assert signed["critical"]["type"] == "atomic container signature"
