"""check-offline's node mirror checks: pods neither pinned nor stored, the drop-in."""

from __future__ import annotations

import dataclasses

from nodeagent.offline.checks import run_checks
from nodeagent.offline.facts import Facts, NodeMirrorDropin, PodImage
from nodeagent.offline.findings import PodRef
from nodeagent.offline.mirror_checks import (
    MIRROR_DROPIN_MISSING,
    MIRROR_DROPIN_STALE,
    POD_IMAGE_NOT_HELD,
)
from tests.unit.offline.test_checks import A, ready_facts

STRANGER = "quay.example.com/team/other@sha256:" + "d" * 64
STORED = "quay.example.com/team/kept@sha256:" + "e" * 64
LISTEN = "127.0.0.1:22626"
DROPIN = "/etc/containers/registries.conf.d/98-nodeagent-node-mirror.conf"


def reasons(facts: Facts) -> list[str]:
    return [item.reason for item in run_checks(facts).findings]


def with_pods(*images: str) -> Facts:
    pods = tuple(
        PodImage(PodRef("ns", f"pod-{i}", f"u{i}"), "c", ref, "IfNotPresent", "api")
        for i, ref in enumerate(images)
    )
    return dataclasses.replace(
        ready_facts(), pods=pods, stored_digests=frozenset({STORED.rpartition("@")[2]})
    )


def test_a_pod_image_neither_pinned_nor_stored_is_found() -> None:
    facts = with_pods(A, STORED, STRANGER)
    found = [(x.reason, x.subject) for x in run_checks(facts).findings]
    assert found == [(POD_IMAGE_NOT_HELD, STRANGER)]


def test_unknown_store_is_not_counted_as_empty() -> None:
    facts = dataclasses.replace(with_pods(STRANGER), stored_digests=None)
    assert POD_IMAGE_NOT_HELD not in reasons(facts)


def dropin(text: str | None, *repositories: str) -> Facts:
    found = NodeMirrorDropin(DROPIN, LISTEN, frozenset(repositories), text)
    return dataclasses.replace(ready_facts(), mirror_dropin=found)


def entry(prefix: str, mirror: str) -> str:
    return (
        f'[[registry]]\nprefix = "{prefix}"\nlocation = "{prefix}"\n'
        f'[[registry.mirror]]\nlocation = "{mirror}"\ninsecure = true\n'
        'pull-from-mirror = "digest-only"\n'
    )


def test_the_dropin_missing_stale_or_right() -> None:
    repo = "quay.example.com/team/kept"
    assert reasons(dropin(None, repo)) == [MIRROR_DROPIN_MISSING]
    assert reasons(dropin(None)) == []  # nothing held: nothing to mirror
    right = entry(repo, f"{LISTEN}/team/kept")
    assert reasons(dropin(right, repo)) == []
    other_port = entry(repo, "127.0.0.1:1/team/kept")
    assert reasons(dropin(other_port, repo)) == [MIRROR_DROPIN_STALE]
    extra = right + entry("quay.example.com/gone", f"{LISTEN}/gone")
    (stale,) = run_checks(dropin(extra, repo)).findings
    assert stale.reason == MIRROR_DROPIN_STALE and "quay.example.com/gone" in stale.message
    assert reasons(dropin("[[registry]\nbroken", repo)) == [MIRROR_DROPIN_STALE]
