"""Each pure check of the offline drill: the condition made in the facts, the finding seen."""

from __future__ import annotations

import dataclasses

import pytest

from nodeagent.offline import findings as f
from nodeagent.offline.checks import CHECKS, run_checks
from nodeagent.offline.facts import (
    Facts,
    KubeletImagePolicy,
    PinnedSet,
    PodImage,
    RunningContainer,
    SignaturePolicy,
)
from nodeagent.offline.findings import MAX_FINDINGS_PER_REASON, PodRef, finding
from nodeagent.ports import StoredImage

A = "quay.example.com/apps/a@sha256:" + "a" * 64
B = "quay.example.com/apps/b@sha256:" + "b" * 64
PAUSE = "quay.example.com/ocp/pause@sha256:" + "c" * 64


def image(ref: str, *, is_pinned: bool = True, tags: tuple[str, ...] = ()) -> StoredImage:
    digest = ref.rpartition("@")[2]
    return StoredImage(digest, tags, (ref,), 1000, is_pinned)


def ready_facts() -> Facts:
    """A node that passes every check: sets pinned, pause pinned, store holds all."""
    return Facts(
        sets=(PinnedSet("apps", (A, B)),),
        images=(image(A), image(B), image(PAUSE)),
        containers=(RunningContainer("c1", "app", A, A.rpartition("@")[2], "ns", "pod-a"),),
        pause_image=PAUSE,
        pause_source="/etc/crio/crio.conf.d/00-default",
        pods=(PodImage(PodRef("ns", "pod-a", "u1"), "app", A, "IfNotPresent", "api"),),
        kubelet=KubeletImagePolicy("/etc/kubernetes/kubelet.conf", "NeverVerifyPreloadedImages"),
        signature_policy=SignaturePolicy(
            "/etc/containers/policy.json", ("insecureAcceptAnything",)
        ),
        store_restorable=frozenset({A, B}),
    )


def reasons(facts: Facts) -> list[str]:
    return [item.reason for item in run_checks(facts).findings]


def test_a_ready_node_has_no_finding_and_the_condition_is_true() -> None:
    report = run_checks(ready_facts())
    assert report.findings == ()
    condition = report.condition()
    assert (condition.type, condition.is_true) == ("OfflineReady", True)
    assert report.checks == tuple(name for name, _ in CHECKS)


def test_a_pinned_image_missing_and_one_not_pinned() -> None:
    facts = dataclasses.replace(ready_facts(), images=(image(A, is_pinned=False), image(PAUSE)))
    found = run_checks(facts).findings
    assert [(x.reason, x.subject) for x in found if x.reason.startswith("Pinned")] == [
        (f.PINNED_IMAGE_NOT_PINNED, A),
        (f.PINNED_IMAGE_MISSING, B),
    ]


@pytest.mark.parametrize(
    ("pause", "images", "expected"),
    [
        (None, (), [f.PAUSE_IMAGE_UNKNOWN]),
        (PAUSE, (), [f.PAUSE_IMAGE_MISSING]),
        (PAUSE, (image(PAUSE, is_pinned=False),), [f.PAUSE_IMAGE_NOT_PINNED]),
        ("registry.k8s.io/pause:3.10", (image(PAUSE, tags=("registry.k8s.io/pause:3.10",)),), []),
        ("pause:3.10", (image(PAUSE, tags=("docker.io/library/pause:3.10",)),), []),
    ],
)
def test_the_pause_image(
    pause: str | None, images: tuple[StoredImage, ...], expected: list[str]
) -> None:
    facts = dataclasses.replace(
        ready_facts(), sets=(), pause_image=pause, images=images, containers=()
    )
    assert reasons(facts) == expected


def test_running_containers_whose_image_is_gone_or_unpinned_are_listed_once_each() -> None:
    other = "quay.example.com/apps/other@sha256:" + "d" * 64
    containers = (
        RunningContainer("c1", "app", A, "sha256:" + "a" * 64, "ns", "pod-a"),
        RunningContainer("c2", "side", other, "sha256:" + "d" * 64, "ns", "pod-a"),
        RunningContainer("c3", "side", other, "sha256:" + "d" * 64, "ns", "pod-b"),
        RunningContainer("c4", "gone", "quay.example.com/x:1", "sha256:" + "e" * 64),
    )
    images = (image(A), image(B), image(PAUSE), image(other, is_pinned=False))
    facts = dataclasses.replace(ready_facts(), containers=containers, images=images)
    found = [x for x in run_checks(facts).findings if x.reason.startswith("Container")]
    assert [(x.reason, x.subject) for x in found] == [
        (f.CONTAINER_IMAGE_NOT_PINNED, other),
        (f.CONTAINER_IMAGE_MISSING, "quay.example.com/x:1"),
    ]
    assert "pod ns/pod-a" in found[0].message


def test_pods_that_pull_always_or_name_a_tag() -> None:
    pod = PodRef("ns", "web", "uid-1")
    pods = (
        PodImage(pod, "a", A, "Always", "api"),
        PodImage(pod, "b", "quay.example.com/web:1.2", "IfNotPresent", "api"),
        PodImage(pod, "c", B, "IfNotPresent", "api"),
    )
    facts = dataclasses.replace(ready_facts(), pods=pods)
    found = run_checks(facts).findings
    assert [(x.reason, x.subject) for x in found] == [
        (f.POD_PULLS_ALWAYS, A),
        (f.POD_IMAGE_BY_TAG, "quay.example.com/web:1.2"),
    ]
    assert found[0].pod == pod


@pytest.mark.parametrize(
    ("policy", "allowlist", "gate", "expected"),
    [
        (None, (), None, []),
        ("NeverVerify", (), None, []),
        ("NeverVerifyPreloadedImages", (), None, []),
        ("AlwaysVerify", (), None, [f.KUBELET_VERIFIES_PRELOADED]),
        ("AlwaysVerify", (), False, []),  # the feature gate off: no verification at all
        ("NeverVerifyAllowlistedImages", ("quay.example.com/*",), None, []),
        (
            "NeverVerifyAllowlistedImages",
            ("quay.example.com/apps/a", "quay.example.com/ocp/*"),
            True,
            [f.KUBELET_VERIFIES_PRELOADED],  # b only
        ),
        ("Sometimes", (), None, [f.CHECK_INCOMPLETE]),
    ],
)
def test_the_kubelet_credential_verification_policy(
    policy: str | None, allowlist: tuple[str, ...], gate: bool | None, expected: list[str]
) -> None:
    kubelet = KubeletImagePolicy("/etc/kubernetes/kubelet.conf", policy, allowlist, gate)
    facts = dataclasses.replace(ready_facts(), kubelet=kubelet)
    assert reasons(facts) == expected


def test_allowlisted_policy_names_the_images_it_would_verify() -> None:
    kubelet = KubeletImagePolicy("k", "NeverVerifyAllowlistedImages", ("quay.example.com/apps/a",))
    found = run_checks(dataclasses.replace(ready_facts(), kubelet=kubelet)).findings
    assert sorted(x.subject for x in found) == sorted([B, PAUSE])


@pytest.mark.parametrize(
    ("scopes", "default", "required"),
    [
        ({}, ("signedBy",), {A, B}),
        ({"quay.example.com/apps/a": ("sigstoreSigned",)}, ("insecureAcceptAnything",), {A}),
        (
            {
                "quay.example.com": ("signedBy",),
                "quay.example.com/apps": ("insecureAcceptAnything",),
            },
            (),
            set(),
        ),
        ({"*.example.com": ("sigstoreSigned",)}, ("insecureAcceptAnything",), {A, B}),
        ({"": ("sigstoreSigned",)}, ("insecureAcceptAnything",), {A, B}),
    ],
)
def test_signature_policy_scopes(
    scopes: dict[str, tuple[str, ...]], default: tuple[str, ...], required: set[str]
) -> None:
    policy = SignaturePolicy("/etc/containers/policy.json", default, scopes)
    facts = dataclasses.replace(ready_facts(), signature_policy=policy)
    found = run_checks(facts).findings
    assert {x.subject for x in found if x.reason == f.SIGNATURES_REQUIRED} == required


def test_held_signatures_satisfy_the_policy() -> None:
    policy = SignaturePolicy("p", ("signedBy",))
    facts = dataclasses.replace(
        ready_facts(), signature_policy=policy, held_signatures=frozenset({A, B})
    )
    assert reasons(facts) == []


def test_images_the_store_cannot_bring_back() -> None:
    facts = dataclasses.replace(ready_facts(), store_restorable=frozenset({A}))
    assert [(x.reason, x.subject) for x in run_checks(facts).findings] == [(f.STORE_LACKS_IMAGE, B)]


def test_unknown_facts_are_findings_not_passes() -> None:
    problem = finding(f.CHECK_INCOMPLETE, "could not read the runtime", "start CRI-O")
    facts = Facts(problems=(problem,))
    report = run_checks(facts)
    assert not report.is_ready
    assert report.condition().reason == f.CHECK_INCOMPLETE


def test_findings_are_bounded_per_reason_and_counted() -> None:
    refs = tuple(f"quay.example.com/apps/n{i}@sha256:" + "f" * 64 for i in range(120))
    facts = dataclasses.replace(
        ready_facts(), sets=(PinnedSet("big", refs),), store_restorable=frozenset(refs)
    )
    found = run_checks(facts).findings
    assert sum(x.reason == f.PINNED_IMAGE_MISSING for x in found) == MAX_FINDINGS_PER_REASON
    assert found[-1].reason == f.MORE_FINDINGS
    assert found[-1].message.startswith("70 more PinnedImageMissing")


def test_hostile_text_is_escaped_and_clipped() -> None:
    evil = "quay.example.com/x:\x1b[31mred" + "y" * 2000
    pods = (PodImage(PodRef("ns", "p\x07", "u"), "c", evil, "Always", "api"),)
    found = run_checks(dataclasses.replace(ready_facts(), pods=pods)).findings
    assert found
    for item in found:
        assert "\x1b" not in item.message and "\x07" not in item.message
        assert len(item.message) <= f.MAX_MESSAGE_CHARS
