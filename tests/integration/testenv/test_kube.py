"""The test Kubernetes API server is the real thing, locked down as a cluster's control plane is.

Each test talks to the session's etcd + kube-apiserver (``kube`` fixture) through the built
kubectl or plain HTTPS with client certificates: no mock anywhere.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from tests.testenv.kube import KubeCluster
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration


def _request(
    kube: KubeCluster,
    method: str,
    path: str,
    *,
    identity: tuple[str, list[str]] | None = ("probe", ["system:masters"]),
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, bytes]:
    """One HTTPS request with a client certificate of ``identity`` (user, groups) or none."""
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    if identity is not None:
        cert, key = kube.client_certificate(*identity)
        context.load_cert_chain(str(cert), str(key))
    conn = http.client.HTTPSConnection("127.0.0.1", kube.port, timeout=10, context=context)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _json(kube: KubeCluster, *args: str) -> Any:
    return json.loads(kube.kubectl_ok(*args, "-o", "json"))


@pytest.fixture
def namespace(kube: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-")
    kube.kubectl_ok("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false")


def test_server_is_ready_and_serves_the_built_version(kube: KubeCluster) -> None:
    assert kube.server_url == f"https://127.0.0.1:{kube.port}"
    status, body = _request(kube, "GET", "/readyz")
    assert (status, body) == (200, b"ok")
    status, body = _request(kube, "GET", "/version")
    assert status == 200
    assert json.loads(body)["gitVersion"] == kube.release.version


def test_anonymous_requests_are_refused(kube: KubeCluster) -> None:
    status, body = _request(kube, "GET", "/api/v1/namespaces", identity=None)
    assert status == 401, body


def test_admin_kubeconfig_drives_kubectl(kube: KubeCluster) -> None:
    names = {item["metadata"]["name"] for item in _json(kube, "get", "namespaces")["items"]}
    assert {"default", "kube-system"} <= names
    review = _json(kube, "auth", "whoami")
    assert "system:masters" in review["status"]["userInfo"]["groups"]


def test_rbac_is_enforced(kube: KubeCluster, namespace: str) -> None:
    node = kube.kubeconfig_for_node("rbac-node")
    result = kube.kubectl("get", "secrets", "-A", kubeconfig=node)
    assert result.returncode != 0
    assert "Forbidden" in result.stderr
    assert 'cannot list resource "secrets"' in result.stderr

    # A user with no groups may do nothing until a RoleBinding grants it: RBAC decides.
    alice = kube.kubeconfig_for("alice", [])
    denied = kube.kubectl("get", "configmaps", "-n", namespace, kubeconfig=alice)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    kube.kubectl_ok("create", "role", "read-cm", "-n", namespace, "--verb=list", "--resource=cm")
    kube.kubectl_ok(
        "create", "rolebinding", "alice-read-cm", "-n", namespace, "--role=read-cm", "--user=alice"
    )
    wait_for(
        lambda: (
            kube.kubectl("get", "configmaps", "-n", namespace, kubeconfig=alice).returncode == 0
        ),
        timeout_s=30,
        what="alice's new RoleBinding to take effect",
    )
    other = kube.kubectl("get", "configmaps", "-n", "default", kubeconfig=alice)
    assert "Forbidden" in other.stderr


def test_node_restriction_keeps_a_node_to_its_own_object(kube: KubeCluster) -> None:
    kube.create_node("nr-node-a", {"example.com/pool": "worker"})
    kube.create_node("nr-node-b", {"example.com/pool": "worker"})
    node_a = kube.kubeconfig_for_node("nr-node-a")

    own = json.loads(kube.kubectl_ok("get", "node", "nr-node-a", "-o", "json", kubeconfig=node_a))
    assert own["metadata"]["labels"]["example.com/pool"] == "worker"
    kube.kubectl_ok("label", "node", "nr-node-a", "example.com/agent=ok", kubeconfig=node_a)
    labels = _json(kube, "get", "node", "nr-node-a")["metadata"]["labels"]
    assert labels["example.com/agent"] == "ok"

    # The Node authorizer: a node reads no other Node object (kubectl label reads first).
    read = kube.kubectl("label", "node", "nr-node-b", "example.com/agent=ok", kubeconfig=node_a)
    assert read.returncode != 0
    assert "node 'nr-node-a' cannot read 'nr-node-b', only its own Node object" in read.stderr
    # NodeRestriction: a PATCH sent without reading first (as a kubelet's client may) passes
    # authorization and is refused at admission.
    status, body = _request(
        kube,
        "PATCH",
        "/api/v1/nodes/nr-node-b",
        identity=("system:node:nr-node-a", ["system:nodes"]),
        body=json.dumps({"metadata": {"labels": {"example.com/agent": "ok"}}}).encode(),
        content_type="application/merge-patch+json",
    )
    assert status == 403, body
    refusal = json.loads(body)
    assert refusal["reason"] == "Forbidden"
    assert 'node "nr-node-a" is not allowed to modify node "nr-node-b"' in refusal["message"]
    assert "example.com/agent" not in _json(kube, "get", "node", "nr-node-b")["metadata"]["labels"]

    restricted = kube.kubectl(
        "label", "node", "nr-node-a", "node-restriction.kubernetes.io/x=y", kubeconfig=node_a
    )
    assert restricted.returncode != 0
    assert "Forbidden" in restricted.stderr
    assert "node-restriction.kubernetes.io/" in restricted.stderr


def test_validating_admission_policy_denies(kube: KubeCluster, namespace: str) -> None:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{namespace}-no-forbidden-key"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!has(object.data) || !('forbidden' in object.data)",
                    "message": "configmaps may not carry a 'forbidden' key",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"{namespace}-no-forbidden-key"},
        "spec": {
            "policyName": policy["metadata"]["name"],  # type: ignore[index]
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    kube.kubectl_ok(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [policy, binding]}),
    )
    try:
        attempt = 0

        def denied() -> str | None:
            nonlocal attempt
            attempt += 1
            result = kube.kubectl(
                "create",
                "configmap",
                f"bad-{attempt}",
                "-n",
                namespace,
                "--from-literal=forbidden=1",
            )
            return result.stderr if result.returncode != 0 else None

        message = wait_for(denied, timeout_s=30, interval_s=0.2, what="the policy to deny")
        assert "configmaps may not carry a 'forbidden' key" in message
        kube.kubectl_ok("create", "configmap", "good", "-n", namespace, "--from-literal=fine=1")
    finally:
        kube.kubectl("delete", "validatingadmissionpolicybinding", binding["metadata"]["name"])  # type: ignore[index]
        kube.kubectl("delete", "validatingadmissionpolicy", policy["metadata"]["name"])  # type: ignore[index]


def test_custom_resources_can_be_defined_and_stored(kube: KubeCluster) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.testenv.nodeagent.example"},
        "spec": {
            "group": "testenv.nodeagent.example",
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    kube.kubectl_ok("apply", "-f", "-", input=json.dumps(crd))
    kube.kubectl_ok(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/" + crd["metadata"]["name"],  # type: ignore[index]
    )
    widget = {
        "apiVersion": "testenv.nodeagent.example/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    kube.kubectl_ok("apply", "-f", "-", input=json.dumps(widget))
    assert _json(kube, "get", "widget", "w1")["spec"]["size"] == 3
    widget["spec"] = {"size": 0}
    invalid = kube.kubectl("apply", "-f", "-", input=json.dumps(widget))
    assert invalid.returncode != 0
    assert "spec.size" in invalid.stderr


def test_restarted_apiserver_keeps_data_port_and_certificates(
    kube: KubeCluster, namespace: str
) -> None:
    created = json.loads(
        kube.kubectl_ok(
            "create", "configmap", "survivor", "-n", namespace, "--from-literal=k=v", "-o", "json"
        )
    )
    port, admin = kube.port, kube.admin_kubeconfig
    kube.stop_apiserver()
    assert not kube.apiserver_running
    down = kube.kubectl("get", "configmap", "survivor", "-n", namespace, "--request-timeout=5s")
    assert down.returncode != 0
    assert f"connection to the server 127.0.0.1:{port} was refused" in down.stderr

    kube.start_apiserver()
    assert (kube.port, kube.admin_kubeconfig) == (port, admin)
    after = _json(kube, "get", "configmap", "survivor", "-n", namespace)
    assert after["metadata"]["uid"] == created["metadata"]["uid"]
    assert after["data"] == {"k": "v"}
