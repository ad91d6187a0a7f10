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


# ---------------------------------------------------------------- valid-shaped facts
# The edited documents above parse in one case of five to ten, so the checks see few of them;
# here the three files are of valid shape (pods with containers, a KubeletConfiguration, a
# policy with scopes and requirements, the values from their vocabularies or hostile text)
# and the checks run over all three together with the pinned sets, for every input.
_PINNED = st.sampled_from(
    [_REF, "quay.example.com/etcd@sha256:" + "b" * 64, "registry.k8s.io/pause@sha256:" + "c" * 64,
     "localhost:5000/x/y@sha256:" + "d" * 64]
)  # fmt: skip
_IMAGES = st.one_of(_PINNED, st.sampled_from(["quay.example.com/etcd:3", "pause", ""]), s.words)
_CONTAINERS = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["c", "d", "e"]), "image": _IMAGES},
        optional={"imagePullPolicy": st.one_of(
            st.sampled_from(["Always", "IfNotPresent", "Never"]), s.words)},
    ),
    min_size=1, max_size=4,
)  # fmt: skip
_PODS = st.builds(
    lambda name, containers, init: {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"containers": containers, "initContainers": init},
    },
    st.one_of(st.just("etcd"), s.words), _CONTAINERS, st.one_of(st.just([]), _CONTAINERS),
)  # fmt: skip
_KUBELETS = st.fixed_dictionaries(
    {"kind": st.just("KubeletConfiguration")},
    optional={
        "imagePullCredentialsVerificationPolicy": st.one_of(st.sampled_from(
            ["NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages",
             "AlwaysVerify"]), s.words),
        "preloadedImagesVerificationAllowlist": st.lists(st.one_of(st.sampled_from(
            ["quay.example.com/*", "*", "quay.example.com/apps/a", "registry.k8s.io/pause"]),
            s.words), max_size=4),
        "featureGates": st.fixed_dictionaries(
            {}, optional={"KubeletEnsureSecretPulledImages": st.booleans()}),
    },
)  # fmt: skip
_REQUIREMENTS = st.lists(
    st.fixed_dictionaries({"type": st.one_of(st.sampled_from(
        ["insecureAcceptAnything", "reject", "signedBy", "sigstoreSigned"]), s.words)}),
    max_size=3,
)  # fmt: skip
_SCOPES = st.one_of(
    st.sampled_from(["", "quay.example.com", "quay.example.com/apps", "*.example.com", _REF,
                     "registry.k8s.io", "localhost:5000"]),
    s.words,
)  # fmt: skip
_POLICIES = st.fixed_dictionaries(
    {"default": _REQUIREMENTS},
    optional={"transports": st.fixed_dictionaries(
        {"docker": st.dictionaries(_SCOPES, _REQUIREMENTS, max_size=4)})},
)  # fmt: skip


def _parsed(entry: str, parse: Any, doc: dict[str, Any]) -> Any:
    result = outcome(entry, lambda: parse(s.utf8(json.dumps(doc)), source=entry),
                     allowed=(MalformedInput,))  # fmt: skip
    return None if isinstance(result, BaseException) else result


@given(_PODS, _KUBELETS, _POLICIES, st.lists(_PINNED, min_size=1, max_size=4))
def test_checks_valid_shape(
    pod: dict[str, Any], kubelet: dict[str, Any], policy: dict[str, Any], pinned: list[str]
) -> None:
    pods = _parsed("offline.pods_from_manifest", pods_from_manifest, pod)
    facts = Facts(
        sets=(PinnedSet("s", tuple(pinned)),), images=(),
        pods=None if pods is None else tuple(pods),
        kubelet=_parsed("offline.kubelet_image_policy", kubelet_image_policy, kubelet),
        signature_policy=_parsed("offline.signature_policy", signature_policy, policy),
    )  # fmt: skip
    findings = outcome("offline.run_checks", lambda: run_checks(facts).findings, allowed=())
    assert not isinstance(findings, BaseException)
    for item in findings:
        check_text(item.message, "a finding")
