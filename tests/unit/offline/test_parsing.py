"""The drill's parsers: pods, kubelet configuration, signature policy, CRI-O's pause image."""

from __future__ import annotations

import json

import pytest

from nodeagent.offline.parsing import (
    default_pull_policy,
    kubelet_image_policy,
    pause_image_of,
    pods_from_api,
    pods_from_manifest,
    scope_candidates,
    signature_policy,
)
from nodeagent.pins import ConfigFile
from nodeagent.strict import MalformedInput

STATIC_POD = b"""
apiVersion: v1
kind: Pod
metadata: {name: etcd, namespace: kube-system}
spec:
  initContainers:
  - {name: setup, image: "quay.example.com/etcd@sha256:%s"}
  containers:
  - {name: etcd, image: quay.example.com/etcd}
  - {name: metrics, image: "quay.example.com/metrics:v1"}
  - {name: pinned, image: "quay.example.com/metrics:v1", imagePullPolicy: Never}
""" % (b"a" * 64)


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("quay.example.com/a", "Always"),
        ("quay.example.com/a:latest", "Always"),
        ("quay.example.com:5000/a", "Always"),
        ("quay.example.com:5000/a:1", "IfNotPresent"),
        ("quay.example.com/a@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_kubernetes_default_pull_policy(image: str, policy: str) -> None:
    assert default_pull_policy(image) == policy


def test_a_static_pod_manifest_gets_kubernetes_defaults() -> None:
    found = pods_from_manifest(STATIC_POD, source="/etc/kubernetes/manifests/etcd.yaml")
    assert [(p.container, p.pull_policy) for p in found] == [
        ("setup", "IfNotPresent"),
        ("etcd", "Always"),
        ("metrics", "IfNotPresent"),
        ("pinned", "Never"),
    ]
    assert {p.pod.namespace for p in found} == {"kube-system"}


def test_api_pods_that_ended_are_left_out() -> None:
    running = {
        "metadata": {"name": "a", "namespace": "n", "uid": "u1"},
        "spec": {
            "containers": [{"name": "c", "image": "x.example.com/a:1", "imagePullPolicy": "Always"}]
        },
        "status": {"phase": "Running"},
    }
    done = dict(running, status={"phase": "Succeeded"})
    found = pods_from_api([running, done])
    assert [(p.pod.uid, p.pull_policy) for p in found] == [("u1", "Always")]
    with pytest.raises(MalformedInput):
        pods_from_api([dict(running, status=["Running"])])


@pytest.mark.parametrize(
    "data",
    [
        b"kind: Pod\nspec: {containers: [{image: x, imagePullPolicy: Sometimes}]}",
        b"kind: Pod\nspec: {containers: {image: x}}",
        b"kind: Pod\nspec: {containers: [{image: [x]}]}",
        b"a: &a [*a]",
        b"kind: Pod\nkind: Pod",
        b"\xff\xfe",
        b"[" * 100 + b"]" * 100,
    ],
)
def test_malformed_manifests_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedInput):
        pods_from_manifest(data, source="m.yaml")


def test_kubelet_configuration_yaml_and_json() -> None:
    yaml_doc = b"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages
preloadedImagesVerificationAllowlist: ["quay.example.com/ocp/*"]
featureGates: {KubeletEnsureSecretPulledImages: true}
"""
    policy = kubelet_image_policy(yaml_doc, source="k.yaml")
    assert (policy.policy, policy.allowlist, policy.is_gate_on) == (
        "NeverVerifyAllowlistedImages",
        ("quay.example.com/ocp/*",),
        True,
    )
    json_doc = json.dumps({"kind": "KubeletConfiguration", "maxPods": 250}).encode()
    unset = kubelet_image_policy(json_doc, source="k.json")
    assert (unset.policy, unset.is_gate_on) == (None, None)
    with pytest.raises(MalformedInput):
        kubelet_image_policy(b"featureGates: {KubeletEnsureSecretPulledImages: maybe}", source="k")


def test_signature_policy_reads_requirement_types_by_scope() -> None:
    doc = {
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {"quay.example.com": [{"type": "sigstoreSigned", "keyPath": "/k"}]},
            "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]},
        },
    }
    policy = signature_policy(json.dumps(doc).encode(), source="policy.json")
    assert policy.default == ("reject",)
    assert dict(policy.docker_scopes) == {"quay.example.com": ("sigstoreSigned",)}
    with pytest.raises(MalformedInput):
        signature_policy(b'{"default": [], "default": []}', source="p")
    with pytest.raises(MalformedInput):
        signature_policy(b'{"default": [{"type": 1}]}', source="p")


def test_scope_candidates_most_specific_first() -> None:
    ref = "a.quay.example.com:5000/ns/app@sha256:" + "a" * 64
    assert scope_candidates(ref) == [
        ref,
        "a.quay.example.com:5000/ns/app",
        "a.quay.example.com:5000/ns",
        "a.quay.example.com:5000",
        "*.quay.example.com",
        "*.example.com",
        "*.com",
    ]


def test_pause_image_the_last_file_setting_it_wins() -> None:
    files = [
        ConfigFile("/etc/crio/crio.conf", '[crio.image]\npause_image = "r.example.com/p:1"', False),
        ConfigFile("/etc/crio/crio.conf.d/10-x", "not toml [", False),
        ConfigFile(
            "/etc/crio/crio.conf.d/20-y", '[crio.image]\npause_image = "r.example.com/p:2"', False
        ),
        ConfigFile("/etc/crio/crio.conf.d/30-z", "[crio.runtime]\nx = 1", True),
    ]
    assert pause_image_of(files) == ("r.example.com/p:2", "/etc/crio/crio.conf.d/20-y")
    assert pause_image_of([]) == (None, "")
