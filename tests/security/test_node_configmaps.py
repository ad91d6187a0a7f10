"""A compromised node writes ConfigMaps in ``openshift-config-managed``.

The attacker holds a node's valid client certificate (``system:node:<name>`` in
``system:nodes``) on a cluster where the administrator applied the opt-in
deploy/opt-in/release-signatures.yaml. That namespace holds ``csr-controller-ca``, which the
kube-apiserver operator merges into the API server's client CA (docs/runtime-facts.md,
"ConfigMaps in openshift-config-managed"): a node that could write it could add its own CA and
mint itself any user's certificate. It also holds the release-signature ConfigMaps the CVO
reads: a node that could empty them could block upgrades.

Each test is one move against the real kube-apiserver of tests/testenv with the file applied
as shipped: rewriting ``csr-controller-ca``, creating a ConfigMap of another name or shape,
taking keys out of a signature ConfigMap, deleting one. Each must be refused, and the
ConfigMap be as it was. Then nodeagent's own writes (``SignaturePublisher`` over
``ConfigMaps`` and ``KubeApi``, the daemon's code path) must pass, the first node's create
and a second node's addition; and an operator's identity must not be hindered at all.
About 7 s with the API server running (most requests in process; kubectl only where a
test needs its verbs).
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from nodeagent.adapters.bundles.release import ConfigMaps, StoredSignatures
from nodeagent.adapters.kube import KubeApi
from nodeagent.bundles.release_signatures import SignaturePublisher
from nodeagent.cluster.kinds import CONFIG_MAP
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.errors import NodeAgentError
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, get
from tests.testenv.signed_bundles import Keys, image, signed_bundle, with_release
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

NAMESPACE = "openshift-config-managed"
OPT_IN = DEPLOY / "opt-in" / "release-signatures.yaml"
POLICY = "nodeagent-node-release-signatures-only"
ADMISSION = "app.kubernetes.io/component=admission"
LABEL = "release.openshift.io/verification-signatures"
OPERATOR = "system:serviceaccount:openshift-etcd-operator:etcd-operator"  # one of the writers
CA_BUNDLE = "-----BEGIN CERTIFICATE-----\nthe cluster's CSR signer\n-----END CERTIFICATE-----\n"
ATTACKER_CA = "-----BEGIN CERTIFICATE-----\nthe attacker's CA\n-----END CERTIFICATE-----\n"
TAKEN = "sha256-" + "e" * 64
"""A release-signature ConfigMap oc-mirror (here: the admin) made, one signature in it."""
SIGNATURE = b"an OpenPGP message"


FIRST, SECOND = b"first signature", b"second signature"
BUNDLES = (
    ("sigs-two", [FIRST, SECOND], 5101),
    ("sigs-one", [FIRST], 5101),  # the same release as sigs-two
    ("mirror-two", [FIRST, SECOND], 5102),
    ("mirror-clash", [FIRST], 5103),
)


@dataclass(frozen=True)
class Cluster:
    kube: KubeCluster
    node: Path
    """A kubeconfig of ``system:node:node-x`` in ``system:nodes``."""
    operator: Path
    store: Path
    trusted: Path

    def as_node(
        self, *args: str, body: dict[str, Any] | None = None
    ) -> subprocess.CompletedProcess[str]:
        data = json.dumps(body) if body is not None else None
        return self.kube.kubectl(*args, "-n", NAMESPACE, kubeconfig=self.node, input=data)

    def config_map(self, name: str) -> dict[str, Any] | None:
        return get(self.kube, "configmap", name, NAMESPACE)

    async def read(self, name: str) -> dict[str, Any] | None:
        """The ConfigMap as the admin reads it (in process: no kubectl to start)."""
        api = KubeApi(self.kube.admin_kubeconfig, timeout_s=10, field_manager="test-admin")
        try:
            return await api.get(CONFIG_MAP, name, NAMESPACE)
        finally:
            await api.close()


def signature_map(name: str, keys: dict[str, bytes], **changes: Any) -> dict[str, Any]:
    """A ConfigMap shaped as nodeagent writes one, with ``changes`` to its top level or
    (``labels``, ``annotations``, ``ownerReferences``, ``finalizers``) its metadata."""
    metadata: dict[str, Any] = {"name": name, "labels": {LABEL: ""}}
    for field in ("labels", "annotations", "ownerReferences", "finalizers"):
        if field in changes:
            metadata[field] = changes.pop(field)
    binary = {k: base64.b64encode(v).decode() for k, v in keys.items()}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "binaryData": binary}
    return body | changes


def denied_by_policy(result: subprocess.CompletedProcess[str], words: str) -> None:
    assert result.returncode != 0, result.stdout
    refused_by_policy(result.stderr, words)


def refused_by_policy(message: str, words: str) -> None:
    assert POLICY in message, message
    assert words in message.replace("\n", " "), message


async def patched_by(
    kubeconfig: Path, name: str, patch: dict[str, Any], *, apply: bool = False
) -> str:
    """The API server's answer to a JSON merge patch of ConfigMap ``name`` (or, ``apply``,
    a forced server-side apply of ``patch`` as the whole object) with ``kubeconfig``'s
    identity: its refusal, or "" when admitted. kubectl cannot send these as a node: its
    ``patch`` reads the object first, which a node may not."""
    api = KubeApi(kubeconfig, timeout_s=10, field_manager="attacker")
    try:
        if apply:
            await api.apply(CONFIG_MAP, patch)
        else:
            await api.merge_patch(CONFIG_MAP, name, patch, NAMESPACE)
    except NodeAgentError as exc:
        return exc.message
    finally:
        await api.close()
    return ""


async def created_by(kubeconfig: Path, body: dict[str, Any]) -> str:
    """The API server's refusal of ``kubeconfig``'s create of ``body``, "" when admitted."""
    api = KubeApi(kubeconfig, timeout_s=10, field_manager="attacker")
    body = body | {"metadata": body["metadata"] | {"namespace": NAMESPACE}}
    try:
        await api.create(CONFIG_MAP, body)
    except NodeAgentError as exc:
        return exc.message
    finally:
        await api.close()
    return ""


def _stored_bundle(
    store: Path, keys: Keys, bundle_id: str, signatures: list[bytes], *, seed: int
) -> None:
    """A signed release bundle in the node store; ``seed`` makes its release (digest)."""
    cache = store.parent / "layers"
    release = image("ocp/release", [(2048, seed)], cache)
    plain = signed_bundle(
        store / "bundles" / bundle_id, keys, [release], bundle_id=bundle_id, set_name="release-9"
    )
    with_release(plain, keys, signatures)


def _release_name(store: Path, bundle_id: str) -> str:
    doc = json.loads((store / "bundles" / bundle_id / "bundle.json").read_text())
    return str(doc["release"]["image"]).rpartition("@")[2].replace(":", "-")


def _install_as_documented(kube: KubeCluster) -> None:
    """docs/cluster.md's order: the policy, until it refuses a node (an admin's server-side
    dry run as one, with system:masters so that RBAC lets it through), then the RBAC."""
    kube.kubectl_ok("apply", "--server-side", "-f", str(OPT_IN), "-l", ADMISSION)

    def refused() -> str | None:
        probe = kube.kubectl(
            "create", "configmap", "probe", "-n", NAMESPACE, "--dry-run=server",
            "--as=system:node:probe", "--as-group=system:nodes", "--as-group=system:masters",
        )  # fmt: skip
        return probe.stderr if POLICY in probe.stderr else None

    wait_for(refused, timeout_s=30, interval_s=0.1, what="the policy in force")
    kube.kubectl_ok("apply", "--server-side", "-f", str(OPT_IN))


def _wait_enforced(kube: KubeCluster, node: Path) -> None:
    """Until the RBAC lets the node ask and the policy answers (a server-side dry run)."""

    def answered() -> str | None:
        probe = kube.kubectl(
            "create", "configmap", "nodeagent-probe", "-n", NAMESPACE, "--dry-run=server",
            "--from-literal=a=b", kubeconfig=node,
        )  # fmt: skip
        return probe.stderr if POLICY in probe.stderr else None

    wait_for(answered, timeout_s=30, interval_s=0.2, what="the opt-in RBAC and policy in force")


def _wait_rbac_gone(kube: KubeCluster, verb: str) -> None:
    def gone() -> bool:
        can = kube.kubectl(
            "auth", "can-i", verb, "configmaps", "-n", NAMESPACE,
            "--as=system:node:node-x", "--as-group=system:nodes",
        )  # fmt: skip
        return can.stdout.startswith("no")  # "no - <the Node authorizer's reason>"

    wait_for(gone, timeout_s=30, interval_s=0.2, what=f"nodes no longer allowed to {verb}")


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("node-configmaps")
    keys = Keys.make(work / "keys")
    store = work / "store"
    for bundle_id, signatures, seed in BUNDLES:
        _stored_bundle(store, keys, bundle_id, signatures, seed=seed)
    kube.kubectl("create", "namespace", NAMESPACE)  # another module may have made it
    operator_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "test-operator", "namespace": NAMESPACE},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }  # fmt: skip
    kube.kubectl_ok("apply", "-f", "-", input=json.dumps(operator_role))
    kube.kubectl_ok(
        "create", "rolebinding", "test-operator", "-n", NAMESPACE, "--role=test-operator",
        f"--user={OPERATOR}",
    )  # fmt: skip
    kube.kubectl_ok(
        "create", "configmap", "csr-controller-ca", "-n", NAMESPACE,
        f"--from-literal=ca-bundle.crt={CA_BUNDLE}",
    )  # fmt: skip
    taken = signature_map(TAKEN, {f"{TAKEN}-1": SIGNATURE})
    kube.kubectl_ok("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(taken))
    _install_as_documented(kube)
    node = kube.kubeconfig_for_node("node-x")
    _wait_enforced(kube, node)
    yield Cluster(kube, node, kube.kubeconfig_for(OPERATOR, ["system:serviceaccounts"]), store,
                  keys.trusted_dir)  # fmt: skip
    kube.kubectl("delete", "-f", str(OPT_IN), "-l", "app.kubernetes.io/component=rbac")
    _wait_rbac_gone(kube, "patch")  # test_release_signatures.py starts without the opt-in
    kube.kubectl("delete", "-f", str(OPT_IN), "-l", ADMISSION)
    names = ["csr-controller-ca", TAKEN, "operator-made"]
    names += [_release_name(store, bundle_id) for bundle_id, _, _ in BUNDLES]
    kube.kubectl("delete", "configmap", "-n", NAMESPACE, "--ignore-not-found", *names)
    kube.kubectl("delete", "rolebinding,role", "test-operator", "-n", NAMESPACE)


# ---------------------------------------------------------------- the attacks
async def test_a_node_cannot_rewrite_csr_controller_ca(cluster: Cluster) -> None:
    patch = {"data": {"ca-bundle.crt": CA_BUNDLE + ATTACKER_CA}}
    merged = await patched_by(cluster.node, "csr-controller-ca", patch)
    refused_by_policy(merged, "may only write release-signature ConfigMaps named sha256-")
    whole = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "csr-controller-ca", "namespace": NAMESPACE},
             "data": {"ca-bundle.crt": ATTACKER_CA}}  # fmt: skip
    applied = await patched_by(cluster.node, "csr-controller-ca", whole, apply=True)
    refused_by_policy(applied, "may only write release-signature ConfigMaps named sha256-")
    found = await cluster.read("csr-controller-ca")
    assert found is not None
    assert found["data"] == {"ca-bundle.crt": CA_BUNDLE}


async def test_a_member_of_system_nodes_without_a_node_name_is_held_too(
    cluster: Cluster,
) -> None:
    """The RBAC is bound to the group: any certificate in it is narrowed, not only node names."""
    other = cluster.kube.kubeconfig_for("not-a-node-name", ["system:nodes"])
    patch = {"data": {"ca-bundle.crt": ATTACKER_CA}}
    answer = await patched_by(other, "csr-controller-ca", patch)
    refused_by_policy(answer, "may only write release-signature ConfigMaps named sha256-")
    found = await cluster.read("csr-controller-ca")
    assert found is not None and found["data"] == {"ca-bundle.crt": CA_BUNDLE}


@pytest.mark.parametrize(
    "name",
    [
        "kube-apiserver-client-ca",
        "signatures-managed",
        "sha256-" + "g" * 64,
        "sha256-" + "e" * 63,
        "sha256-" + "e" * 64 + "x",
    ],
)
async def test_a_node_cannot_create_a_config_map_of_another_name(
    cluster: Cluster, name: str
) -> None:
    answer = await created_by(cluster.node, signature_map(name, {f"{name}-1": b"x"}))
    refused_by_policy(answer, "may only write release-signature ConfigMaps named sha256-")
    assert await cluster.read(name) is None


NEW = "sha256-" + "f" * 64
BAD_SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "data": (signature_map(NEW, {f"{NEW}-1": b"x"}, data={"ca-bundle.crt": ATTACKER_CA}),
             "binaryData only"),
    "no-label": (signature_map(NEW, {f"{NEW}-1": b"x"}, labels={}), "exactly the label"),
    "other-label": (signature_map(NEW, {f"{NEW}-1": b"x"}, labels={LABEL: "", "a": "b"}),
                    "exactly the label"),
    "label-value": (signature_map(NEW, {f"{NEW}-1": b"x"}, labels={LABEL: "x"}),
                    "exactly the label"),
    "no-keys": (signature_map(NEW, {}), "1 to 16 binaryData keys"),
    "key-of-another-digest": (signature_map(NEW, {f"{TAKEN}-1": b"x"}),
                              "1 to 16 binaryData keys"),
    "key-index-0": (signature_map(NEW, {f"{NEW}-0": b"x"}), "1 to 16 binaryData keys"),
    "key-index-10000": (signature_map(NEW, {f"{NEW}-10000": b"x"}), "1 to 16 binaryData keys"),
    "empty-value": (signature_map(NEW, {f"{NEW}-1": b""}), "1 to 16 binaryData keys"),
    "value-over-64-KiB": (signature_map(NEW, {f"{NEW}-1": b"x" * 65537}),  # base64 as 65536
                          "1 to 16 binaryData keys"),
    "17-keys": (signature_map(NEW, {f"{NEW}-{n}": b"x" for n in range(1, 18)}),
                "1 to 16 binaryData keys"),
    "immutable": (signature_map(NEW, {f"{NEW}-1": b"x"}, immutable=True), "immutable"),
    "finalizer": (signature_map(NEW, {f"{NEW}-1": b"x"}, finalizers=["example.com/hold"]),
                  "finalizers"),
    "foreign-annotation": (signature_map(NEW, {f"{NEW}-1": b"x"},
                           annotations={"include.release.openshift.io/x": "true"}),
                           "only the annotations"),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(BAD_SHAPES))
async def test_a_node_cannot_create_a_signature_config_map_of_another_shape(
    cluster: Cluster, shape: str
) -> None:
    body, words = BAD_SHAPES[shape]
    refused_by_policy(await created_by(cluster.node, body), words)
    assert await cluster.read(NEW) is None


ONE = base64.b64encode(SIGNATURE).decode()
UPDATES: dict[str, tuple[dict[str, Any], str]] = {
    "remove-key": ({"binaryData": {f"{TAKEN}-1": None, f"{TAKEN}-2": ONE}}, "only add"),
    "replace-key": ({"binaryData": {f"{TAKEN}-1": base64.b64encode(b"junk").decode()}},
                    "only add"),
    "empty-it": ({"binaryData": None}, "1 to 16 binaryData keys"),
    "drop-label": ({"metadata": {"labels": None}}, "never changes labels"),
    "add-label": ({"metadata": {"labels": {"a": "b"}}}, "never changes labels"),
    "owner": ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
               "name": "gone", "uid": "00000000-0000-0000-0000-000000000001"}]}},
              "owner references"),
    "data": ({"data": {"x": "y"}}, "binaryData only"),
}  # fmt: skip


@pytest.mark.parametrize("move", list(UPDATES))
async def test_a_node_cannot_take_signatures_out_of_a_config_map(
    cluster: Cluster, move: str
) -> None:
    patch, words = UPDATES[move]
    refused_by_policy(await patched_by(cluster.node, TAKEN, patch), words)
    found = await cluster.read(TAKEN)
    assert found is not None
    assert found["binaryData"] == {f"{TAKEN}-1": ONE}
    assert found["metadata"]["labels"] == {LABEL: ""}


def test_a_node_cannot_delete_a_config_map(cluster: Cluster) -> None:
    for name in (TAKEN, "csr-controller-ca"):
        result = cluster.as_node("delete", "configmap", name, "--wait=false")
        assert result.returncode != 0
        assert 'cannot delete resource "configmaps"' in result.stderr, result.stderr
        assert cluster.config_map(name) is not None


def test_the_policy_holds_where_rbac_grants_a_node_more(cluster: Cluster) -> None:
    """An administrator who gives nodes every verb there still has the policy: delete, update
    (PUT) and delete-collection by a node are refused by it, not by RBAC."""
    kube = cluster.kube
    wider = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "test-wider", "namespace": NAMESPACE},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }  # fmt: skip
    kube.kubectl_ok("apply", "-f", "-", input=json.dumps(wider))
    kube.kubectl_ok(
        "create", "rolebinding", "test-wider", "-n", NAMESPACE, "--role=test-wider",
        "--group=system:nodes",
    )  # fmt: skip
    try:
        wait_for(
            lambda: "may not delete" in cluster.as_node("delete", "configmap", TAKEN).stderr,
            timeout_s=30, interval_s=0.2, what="the wider RBAC in force",
        )  # fmt: skip
        replaced = cluster.as_node(
            "replace", "-f", "-", body={"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "csr-controller-ca"},
                                        "data": {"ca-bundle.crt": ATTACKER_CA}},
        )  # fmt: skip
        denied_by_policy(replaced, "may only write release-signature ConfigMaps named sha256-")
        one_by_one = cluster.as_node("delete", "configmaps", "--all", "--wait=false")
        denied_by_policy(one_by_one, "may not delete")
        collection = f"/api/v1/namespaces/{NAMESPACE}/configmaps"  # one deletecollection
        everything = kube.kubectl("delete", "--raw", collection, kubeconfig=cluster.node)
        denied_by_policy(everything, "may not delete")
    finally:
        kube.kubectl("delete", "rolebinding,role", "test-wider", "-n", NAMESPACE)
        _wait_rbac_gone(kube, "delete")
    for name in (TAKEN, "csr-controller-ca"):
        assert cluster.config_map(name) is not None
    found = cluster.config_map("csr-controller-ca")
    assert found is not None and found["data"] == {"ca-bundle.crt": CA_BUNDLE}


# ---------------------------------------------------------------- what must still work
def _publisher(cluster: Cluster, node: str) -> tuple[SignaturePublisher, KubeApi]:
    kubeconfig = cluster.kube.kubeconfig_for_node(node)
    api = KubeApi(kubeconfig, timeout_s=10, field_manager=FIELD_MANAGER)
    source = StoredSignatures(cluster.store, cluster.trusted)
    return SignaturePublisher(source, ConfigMaps(api)), api


async def test_the_largest_config_map_a_node_may_write_is_within_the_policy_s_cost(
    cluster: Cluster,
) -> None:
    """15 signatures of 64 KiB (a ConfigMap holds at most 1 MiB), then a 16th of one byte: the
    policy compares every old key's bytes and still answers within its CEL cost budget."""
    name = "sha256-" + "d" * 64
    big = signature_map(name, {f"{name}-{n}": bytes([n]) * 65536 for n in range(1, 16)})
    assert await created_by(cluster.node, big) == ""
    added = {"binaryData": {f"{name}-16": base64.b64encode(b"x").decode()}}
    assert await patched_by(cluster.node, name, added) == ""
    found = await cluster.read(name)
    assert found is not None and len(found["binaryData"]) == 16
    cluster.kube.kubectl_ok("delete", "configmap", name, "-n", NAMESPACE)


async def test_nodeagents_own_writes_are_admitted(cluster: Cluster) -> None:
    """node-a creates the ConfigMap with two signatures; node-b, whose bundle carries only the
    first, adds nothing and removes nothing; node-a again is a no-op. All three admitted."""
    name = _release_name(cluster.store, "sigs-two")
    first, second = (base64.b64encode(s).decode() for s in (FIRST, SECOND))
    for node, bundle_id in (("node-a", "sigs-two"), ("node-b", "sigs-one"), ("node-a", "sigs-two")):
        publisher, api = _publisher(cluster, node)
        try:
            with structlog.testing.capture_logs() as logs:
                assert await publisher.publish(bundle_id), logs
        finally:
            await api.close()
        found = await cluster.read(name)
        assert found is not None
        assert found["binaryData"] == {f"{name}-1": first, f"{name}-2": second}
        assert found["metadata"]["labels"] == {LABEL: ""}
        assert found["metadata"]["annotations"]["nodeagent.openshift.io/bundle"] == bundle_id


def _admin_made(cluster: Cluster, bundle_id: str, signature: bytes) -> str:
    """The release's ConfigMap as oc-mirror or an admin makes it: ``signature`` at -1."""
    name = _release_name(cluster.store, bundle_id)
    made = signature_map(name, {f"{name}-1": signature})
    cluster.kube.kubectl_ok("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(made))
    return name


async def test_a_node_adds_its_signatures_to_one_an_admin_made(cluster: Cluster) -> None:
    name = _admin_made(cluster, "mirror-two", FIRST)
    publisher, api = _publisher(cluster, "node-c")
    try:
        with structlog.testing.capture_logs() as logs:
            assert await publisher.publish("mirror-two"), logs
    finally:
        await api.close()
    found = await cluster.read(name)
    assert found is not None
    assert found["binaryData"] == {
        f"{name}-1": base64.b64encode(FIRST).decode(),
        f"{name}-2": base64.b64encode(SECOND).decode(),
    }


async def test_nodeagent_never_replaces_a_signature_another_wrote(cluster: Cluster) -> None:
    """The admin's -1 holds other bytes: nodeagent's -1 would replace it, so the write is
    refused, and the journal says to apply by hand."""
    name = _admin_made(cluster, "mirror-clash", b"another signature")
    publisher, api = _publisher(cluster, "node-c")
    try:
        with structlog.testing.capture_logs() as logs:
            assert not await publisher.publish("mirror-clash")
    finally:
        await api.close()
    (refused,) = logs
    assert (refused["event"], refused["reason"]) == (
        "release_signatures_not_applied",
        "ApiAccessDenied",
    )
    assert POLICY in refused["error"]
    found = await cluster.read(name)
    assert found is not None
    assert found["binaryData"] == {f"{name}-1": base64.b64encode(b"another signature").decode()}


def test_an_operator_is_not_hindered(cluster: Cluster) -> None:
    """The operators that write this namespace are never evaluated by the policy."""
    kube, operator = cluster.kube, cluster.operator
    patch = json.dumps({"data": {"ca-bundle.crt": CA_BUNDLE + "rotated\n"}})
    kube.kubectl_ok("patch", "configmap", "csr-controller-ca", "-n", NAMESPACE, "--type=merge",
                    "-p", patch, kubeconfig=operator)  # fmt: skip
    made = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "operator-made", "namespace": NAMESPACE, "labels": {"a": "b"}},
            "data": {"ca-bundle.crt": CA_BUNDLE}}  # fmt: skip
    kube.kubectl_ok("create", "-f", "-", kubeconfig=operator, input=json.dumps(made))
    kube.kubectl_ok("delete", "configmap", "operator-made", "-n", NAMESPACE, kubeconfig=operator)
    found = cluster.config_map("csr-controller-ca")
    assert found is not None and found["data"] == {"ca-bundle.crt": CA_BUNDLE + "rotated\n"}
    back = json.dumps({"data": {"ca-bundle.crt": CA_BUNDLE}})  # as the other tests expect it
    kube.kubectl_ok("patch", "configmap", "csr-controller-ca", "-n", NAMESPACE, "--type=merge",
                    "-p", back, kubeconfig=operator)  # fmt: skip
