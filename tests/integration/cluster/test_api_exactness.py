"""The CRDs of deploy/ against a real kube-apiserver: OpenShift's words and rules.

* PinnedImageSet: the apiserver refuses bad image references with openshift/api's
  messages, word for word (machineconfiguration/v1 ``PinnedImageRef``), and its table
  output (what ``kubectl get`` prints) has no column that is always empty.
* NodeImageStatus: per-set generations follow MachineConfigNode's types, limits and CEL
  transition rules; the apiserver refuses a status write that breaks one, with the rule's
  message. Writes go as the node writes them (its own identity, ``/status``, server-side
  apply, bodies from ``cluster.objects.status_object``).
* Bundle outcomes (verified, imported, refused with a reason) appear in the object.
* The node's OS image (recorded rpm-ostree output) is stored and shown by ``-o wide``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.kinds import NODE_IMAGE_STATUS
from nodeagent.cluster.objects import FIELD_MANAGER, NodeIdentity, owner_object, status_object
from nodeagent.errors import ApiRequestRejected
from nodeagent.nodeos import booted_from_rpm_ostree, os_image
from nodeagent.status import BundleReport, NodeStatus, PullProgress, SetStatus
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import get, install_deploy, pinned_image_set

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "ab" * 32
GOOD = f"registry.example.com/ns/app@{DIGEST}"
DIGEST_MESSAGE = (
    "the OCI Image reference must end with a valid '@sha256:<digest>' suffix, "
    "where '<digest>' is 64 characters long"
)
NAME_MESSAGE = (
    "the OCI Image name should follow the host[:port][/namespace]/name format, "
    "resembling a valid URL without the scheme"
)


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


@pytest.fixture
def node(cluster: KubeCluster) -> Iterator[str]:
    name = f"exact-{uuid.uuid4().hex[:8]}"
    cluster.create_node(name)
    yield name
    cluster.kubectl("delete", "node", name, "--wait=false")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- PinnedImageSet
@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("foo.bar", DIGEST_MESSAGE),  # openshift/api's own test case
        ("registry.example.com/app:latest", DIGEST_MESSAGE),
        (f"registry.example.com/app@sha256:{'AB' * 32}", DIGEST_MESSAGE),
        (f"registry.example.com/app@sha256:{'ab' * 31}", DIGEST_MESSAGE),
        (f"localhost/app@{DIGEST}", NAME_MESSAGE),  # no dot in the host
        (f"registry.example.com/a/b/app@{DIGEST}", NAME_MESSAGE),  # two namespaces
    ],
)
def test_a_bad_reference_is_refused_with_openshifts_message(
    cluster: KubeCluster, ref: str, message: str
) -> None:
    name = unique("bad")
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(pinned_image_set(name, [ref])))
    assert result.returncode != 0, result.stdout
    assert f'spec.pinnedImages[0].name: Invalid value: "string": {message}' in result.stderr
    assert get(cluster, "pinnedimagesets", name) is None


@pytest.mark.parametrize(
    "ref",
    [
        GOOD,
        f"registry.example.com:5000/app@{DIGEST}",
        f"registry.example.com/my-namespace/custom-os-image@{DIGEST}",
    ],
)
def test_openshifts_valid_forms_are_accepted(cluster: KubeCluster, ref: str) -> None:
    name = unique("good")
    cluster.kubectl_ok("create", "-f", "-", input=json.dumps(pinned_image_set(name, [ref])))
    try:
        found = get(cluster, "pinnedimagesets", name)
        assert found is not None
        assert found["spec"]["pinnedImages"] == [{"name": ref}]
    finally:
        cluster.kubectl("delete", "pinnedimageset", name)


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def table(cluster: KubeCluster, path: str) -> dict[str, Any]:
    """The apiserver's Table for ``path`` (what ``kubectl get`` renders), as admin."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1", cluster.port, timeout=10, context=cluster._ssl_context()
    )
    try:
        conn.request("GET", path, headers={"Accept": TABLE})
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body[:2000]
    finally:
        conn.close()
    found: dict[str, Any] = json.loads(body)
    assert found["kind"] == "Table"
    return found


def test_the_table_has_no_column_that_is_always_empty(cluster: KubeCluster) -> None:
    name = unique("table")
    refs = [GOOD, f"registry.example.com/ns/other@{DIGEST}"]
    cluster.kubectl_ok("create", "-f", "-", input=json.dumps(pinned_image_set(name, refs)))
    try:
        found = table(cluster, f"/apis/machineconfiguration.openshift.io/v1/pinnedimagesets/{name}")
    finally:
        cluster.kubectl("delete", "pinnedimageset", name)
    columns = [c["name"] for c in found["columnDefinitions"]]
    assert columns == ["Name", "Age"]  # openshift/api defines no printer columns
    (row,) = found["rows"]
    assert row["cells"][0] == name
    assert all(cell not in ("", None) for cell in row["cells"]), row["cells"]


# ---------------------------------------------------------------- NodeImageStatus
def a_set(
    desired: int,
    current: int | None = None,
    failed: int | None = None,
    error: str | None = None,
) -> SetStatus:
    return SetStatus(
        name="edge",
        source="cluster",
        is_persistent=True,
        state="Pinned" if current == desired else "Degraded" if failed else "Progressing",
        desired_generation=desired,
        current_generation=current,
        last_failed_generation=failed,
        last_failed_error=error,
        images_total=1,
        images_present=1,
        images_pinned=1 if current == desired else 0,
    )


def body(node: str, status: NodeStatus) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return status_object(
        NodeIdentity(node, ""),
        status,
        PullProgress(),
        placement=None,
        previous_conditions=[],
        now=now,
        agent_version="test",
    )


def write(cluster: KubeCluster, node: str, doc: dict[str, Any]) -> None:
    """Apply ``doc`` to the node's object as its daemon does (own identity, /status)."""

    async def run() -> None:
        api = KubeApi(cluster.kubeconfig_for_node(node), timeout_s=10, field_manager=FIELD_MANAGER)
        try:
            await api.apply(NODE_IMAGE_STATUS, owner_object(NodeIdentity(node, "")))
            await api.apply(NODE_IMAGE_STATUS, doc, subresource="status")
        finally:
            await api.close()

    asyncio.run(run())


def write_sets(cluster: KubeCluster, node: str, *sets: SetStatus) -> None:
    write(cluster, node, body(node, NodeStatus(sets=sets, conditions=())))


def with_entry(node: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A status body whose one set entry is ``entry`` as given (bypassing the renderer)."""
    doc = body(node, NodeStatus(sets=(a_set(1),), conditions=()))
    doc["status"]["pinnedImageSets"] = [{"name": "edge"} | entry]
    return doc


def stored_entry(cluster: KubeCluster, node: str) -> dict[str, Any]:
    nis = get(cluster, "nodeimagestatuses", node)
    assert nis is not None
    (entry,) = nis["status"]["pinnedImageSets"]
    found: dict[str, Any] = entry
    return found


def test_generations_that_move_forward_are_stored(cluster: KubeCluster, node: str) -> None:
    write_sets(cluster, node, a_set(1))
    write_sets(cluster, node, a_set(2, failed=2, error="pull failed"))
    write_sets(cluster, node, a_set(3, current=3, failed=2, error="pull failed"))
    entry = stored_entry(cluster, node)
    assert (entry["desiredGeneration"], entry["currentGeneration"]) == (3, 3)
    assert (entry["lastFailedGeneration"], entry["lastFailedGenerationError"]) == (
        2,
        "pull failed",
    )


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (a_set(3), a_set(2), "desiredGeneration must not decrease"),
        (a_set(3, current=3), a_set(3, current=2), "currentGeneration must not decrease"),
        (
            a_set(3, failed=3, error="x"),
            a_set(3, failed=2, error="x"),
            "lastFailedGeneration must not decrease",
        ),
    ],
    ids=["desired", "current", "lastFailed"],
)
def test_a_generation_going_back_is_refused(
    cluster: KubeCluster, node: str, before: SetStatus, after: SetStatus, message: str
) -> None:
    write_sets(cluster, node, before)
    with pytest.raises(ApiRequestRejected, match=message):
        write_sets(cluster, node, after)
    assert stored_entry(cluster, node)["desiredGeneration"] == before.desired_generation


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"desiredGeneration": 2, "currentGeneration": 3},
            "desired generation must be greater than or equal to the current generation",
        ),
        (
            {"desiredGeneration": 2, "lastFailedGeneration": 3, "lastFailedGenerationError": "x"},
            "desired generation must be greater than or equal to the last failed generation",
        ),
        (
            {"desiredGeneration": 2, "lastFailedGeneration": 2},
            "last failed generation error must be defined on image pull and pin failure",
        ),
        ({"desiredGeneration": 0}, "should be greater than or equal to 1"),
        ({"desiredGeneration": 1, "currentGeneration": 0}, "should be greater than or equal to 1"),
        ({"desiredGeneration": 2**31}, "should be less than or equal to 2147483647"),
        ({"desiredGeneration": 1, "lastFailedGenerationError": "x" * 32769}, "32768"),
    ],
    ids=["current>desired", "failed>desired", "no-error", "zero", "zero-current", "int32", "len"],
)
def test_a_status_breaking_machineconfignodes_rules_is_refused(
    cluster: KubeCluster, node: str, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiRequestRejected, match=message):
        write(cluster, node, with_entry(node, entry))


def test_a_failed_generation_with_an_empty_error_still_carries_one(
    cluster: KubeCluster, node: str
) -> None:
    failed = a_set(2, failed=2, error="")
    write_sets(cluster, node, failed)
    entry = stored_entry(cluster, node)
    assert entry["lastFailedGeneration"] == 2
    assert entry["lastFailedGenerationError"]


# ---------------------------------------------------------------- bundles
def test_bundle_outcomes_appear_in_the_status(cluster: KubeCluster, node: str) -> None:
    reports = (
        BundleReport("/run/media/a", "verified", "edge-4.18.1", images_total=3),
        BundleReport("/run/media/b", "imported", "edge-4.18.2", images_total=3, images_present=3),
        BundleReport(
            "/run/media/c",
            "rejected",
            "edge-4.18.3",
            reason="BundleSignatureInvalid",
            message="the signature does not verify with any trusted key",
        ),
        BundleReport("peer 10.0.0.2", "fetching", "edge-4.18.4", images_total=3),
    )
    write(cluster, node, body(node, NodeStatus(sets=(), conditions=(), bundles=reports)))
    nis = get(cluster, "nodeimagestatuses", node)
    assert nis is not None
    seen = {b["bundleId"]: b for b in nis["status"]["bundles"]}
    assert {k: v["state"] for k, v in seen.items()} == {
        "edge-4.18.1": "verified",
        "edge-4.18.2": "imported",
        "edge-4.18.3": "rejected",
        "edge-4.18.4": "fetching",
    }
    assert seen["edge-4.18.3"]["reason"] == "BundleSignatureInvalid"
    assert seen["edge-4.18.3"]["message"] == "the signature does not verify with any trusted key"
    assert seen["edge-4.18.2"]["images"] == {"total": 3, "present": 3}


# ---------------------------------------------------------------- node OS
def test_the_os_image_from_recorded_tool_output_is_stored_and_shown(
    cluster: KubeCluster, node: str
) -> None:
    fixtures = Path(__file__).parents[2] / "unit" / "nodeos" / "fixtures"
    image = os_image(
        (fixtures / "os-release-rhcos").read_text(),
        bootc=None,
        rpm_ostree=booted_from_rpm_ostree(
            (fixtures / "rpm-ostree-status-container.json").read_bytes()
        ),
    )
    status = NodeStatus(sets=(), conditions=(), os_image=image)
    write(cluster, node, body(node, status))
    nis = get(cluster, "nodeimagestatuses", node)
    assert nis is not None
    assert nis["status"]["osImage"] == image.to_json()
    found = table(cluster, f"/apis/nodeagent.io/v1alpha1/nodeimagestatuses/{node}")
    columns = [c["name"] for c in found["columnDefinitions"]]
    (row,) = found["rows"]
    shown = dict(zip(columns, row["cells"], strict=True))
    assert shown["OS"] == "4.18"
    assert image.booted is not None
    assert shown["OS-Digest"] == image.booted.digest
