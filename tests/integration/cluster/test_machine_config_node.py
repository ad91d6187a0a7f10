"""The MachineConfigNode mirror against openshift/api's MachineConfigNode v1 schema, served
by a real kube-apiserver (tests/testenv/manifests/machineconfignode-v1.yaml).

The schema's own rules first (so a test that passes is a test against them), then the
bodies nodeagent writes: the worst case of its error budget is accepted whole, and a
generation that goes back is refused, by the server, with the API's message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nodeagent.cluster.machine_config_node import MAX_ERROR_CHARS, MAX_SETS
from nodeagent.cluster.machine_config_node import machine_config_node_status as mirror
from nodeagent.cluster.objects import NodeIdentity
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, get, install_mco, machine_config_node, remove_mco
from tests.unit.cluster.test_objects import NOW, a_set, node_status

API = "machineconfiguration.openshift.io/v1"


@pytest.fixture(scope="module")
def mco(kube: KubeCluster) -> Iterator[KubeCluster]:
    install_mco(kube)
    yield kube
    remove_mco(kube)


def apply_status(kube: KubeCluster, body: dict[str, Any]) -> tuple[int, str]:
    result = kube.kubectl(
        "apply", "--server-side", "--field-manager=nodeagent", "--subresource=status",
        "-f", "-", input=json.dumps(body),
    )  # fmt: skip
    return result.returncode, result.stderr


def status_body(node: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MachineConfigNode", "metadata": {"name": node},
            "status": {"pinnedImageSets": list(items)}}  # fmt: skip


def test_the_schema_requires_the_operators_spec(mco: KubeCluster) -> None:
    bare = {"apiVersion": API, "kind": "MachineConfigNode", "metadata": {"name": "mcn-bare"},
            "spec": {"node": {"name": "mcn-bare"}}}  # fmt: skip
    result = mco.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(bare))
    assert result.returncode != 0
    assert "spec.configVersion: Required value" in result.stderr
    assert "spec.pool: Required value" in result.stderr
    other = machine_config_node("mcn-named", "worker")
    other["spec"]["node"]["name"] = "someone-else"
    result = mco.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(other))
    assert "spec.node.name should match metadata.name" in result.stderr


def test_generation_rules_are_the_servers(mco: KubeCluster) -> None:
    node = "mcn-rules-1"
    apply(mco, machine_config_node(node, "worker"))
    code, err = apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 1,
                                                     "currentGeneration": 2}))  # fmt: skip
    assert code != 0 and "desired generation must be greater than or equal to the current" in err
    code, err = apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 2,
                                                     "lastFailedGeneration": 2}))  # fmt: skip
    assert code != 0 and "last failed generation error must be defined" in err
    code, err = apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 0}))
    assert code != 0 and "should be greater than or equal to 1" in err
    assert apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 3}))[0] == 0
    code, err = apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 2}))
    assert code != 0 and "desiredGeneration must not decrease" in err


def test_format_int32_is_not_enforced_by_the_server(mco: KubeCluster) -> None:
    """Observed: ``format: int32`` is a hint the apiserver does not check (``minimum`` is):
    a client's own bound is what keeps a generation in the range OpenShift's clients decode."""
    node = "mcn-int32-1"
    apply(mco, machine_config_node(node, "worker"))
    code, err = apply_status(mco, status_body(node, {"name": "a", "desiredGeneration": 2**31}))
    assert code == 0, err


def test_nodeagents_bodies_are_accepted_up_to_the_budget(mco: KubeCluster) -> None:
    node = "mcn-budget-1"
    apply(mco, machine_config_node(node, "worker"))
    identity = NodeIdentity(node, "")
    pulling = node_status(a_set("apps", state="Progressing"))
    code, err = apply_status(mco, mirror(identity, pulling, {"apps"}, [], NOW))
    assert code == 0, err
    written = get(mco, "machineconfignodes", node)
    assert written is not None
    found = {c["type"]: (c["reason"], c["message"]) for c in written["status"]["conditions"]}
    assert found["PinnedImageSetsProgressing"] == (
        "ImagePrefetch",
        f"node is prefetching images: {node}",
    )

    # Worst case: 100 sets failing with errors past the API's limit, each character 4 bytes.
    sets = [
        a_set(f"set-{i:03d}", state="Degraded", reason="InsufficientDiskSpace",
              desired_generation=3, current_generation=None, last_failed_generation=3,
              last_failed_error="\U0001f4a5" * (MAX_ERROR_CHARS + 100))
        for i in range(MAX_SETS)
    ]  # fmt: skip
    body = mirror(identity, node_status(*sets), {s.name for s in sets}, [], NOW)
    size = len(json.dumps(body, ensure_ascii=False).encode())
    code, err = apply_status(mco, body)
    assert code == 0, err[-2000:]
    written = get(mco, "machineconfignodes", node)
    assert written is not None
    names = [item["name"] for item in written["status"]["pinnedImageSets"]]
    assert len(names) == MAX_SETS and "apps" not in names  # apply: unlisted entries go
    degraded = next(
        c for c in written["status"]["conditions"] if c["type"] == "PinnedImageSetsDegraded"
    )
    assert degraded["reason"] == "PrefetchFailed"
    assert degraded["message"].startswith("Error: ")  # a full disk degrades the pool
    print(f"worst-case body: {size} bytes")
    assert size < 600 * 1024

    # A set whose generation goes back (deleted and made anew) is refused by the server.
    back = node_status(a_set("set-000", desired_generation=1, current_generation=1))
    code, err = apply_status(mco, mirror(identity, back, {"set-000"}, [], NOW))
    assert code != 0 and "desiredGeneration must not decrease" in err
