"""Fuzz: the offline drill's parsers (static pod manifests, kubelet configuration,
``policy.json``) and the checks over what they return.

Contract: whatever the bytes, facts or ``MalformedInput``, never another exception, within
the CPU bound; and the findings the checks make of those facts are short and safe to show.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.offline.checks import run_checks
from nodeagent.offline.facts import Facts, PinnedSet
from nodeagent.offline.parsing import kubelet_image_policy, pods_from_manifest, signature_policy
from nodeagent.strict import MalformedInput
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome

_REF = "quay.example.com/apps/a@sha256:" + "a" * 64
_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "etcd", "namespace": "kube-system", "uid": "u"},
    "spec": {
        "containers": [
            {"name": "c", "image": "quay.example.com/etcd:3", "imagePullPolicy": "Always"}
        ]
    },
}
_KUBELET: dict[str, Any] = {
    "kind": "KubeletConfiguration",
    "imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages",
    "preloadedImagesVerificationAllowlist": ["quay.example.com/*"],
    "featureGates": {"KubeletEnsureSecretPulledImages": True},
}
_POLICY: dict[str, Any] = {
    "default": [{"type": "insecureAcceptAnything"}],
    "transports": {"docker": {"quay.example.com": [{"type": "sigstoreSigned", "keyPath": "/k"}]}},
}
_PATHS = [("spec", "containers", 0, "image"), ("spec", "containers"), ("metadata",),
          ("spec", "containers", 0, "imagePullPolicy"), ("kind",)]  # fmt: skip


def _documents(
    base: dict[str, Any], paths: list[tuple[str | int, ...]]
) -> st.SearchStrategy[bytes]:
    seeds = st.just(json.dumps(base).encode())
    return st.one_of(
        s.mutated(seeds),
        s.json_bytes(st.builds(s.replaced, st.just(base), st.sampled_from(paths), s.json_like)),
        s.raw_bytes,
    )


def _checked(facts: Facts) -> None:
    facts = dataclasses.replace(facts, sets=(PinnedSet("s", (_REF,)),), images=())
    findings = outcome("offline.run_checks", lambda: run_checks(facts).findings, allowed=())
    assert not isinstance(findings, BaseException)
    for item in findings:
        check_text(item.message, "a finding")


@given(_documents(_POD, _PATHS))
def test_static_pod_manifests(data: bytes) -> None:
    result = outcome(
        "offline.pods_from_manifest",
        lambda: pods_from_manifest(data, source="m"),
        allowed=(MalformedInput,),
    )
    if isinstance(result, list):
        _checked(Facts(pods=tuple(result)))


@given(
    _documents(
        _KUBELET,
        [
            ("featureGates",),
            ("preloadedImagesVerificationAllowlist",),
            ("imagePullCredentialsVerificationPolicy",),
        ],
    )
)
def test_kubelet_configuration(data: bytes) -> None:
    result = outcome(
        "offline.kubelet_image_policy",
        lambda: kubelet_image_policy(data, source="k"),
        allowed=(MalformedInput,),
    )
    if not isinstance(result, BaseException):
        _checked(Facts(kubelet=result))


@given(_documents(_POLICY, [("default",), ("transports",), ("transports", "docker")]))
def test_signature_policy(data: bytes) -> None:
    result = outcome(
        "offline.signature_policy",
        lambda: signature_policy(data, source="p"),
        allowed=(MalformedInput,),
    )
    if not isinstance(result, BaseException):
        _checked(Facts(signature_policy=result))
