"""The node mirror's drop-in, rendered beside what OpenShift renders into registries.conf
(decision 0058): each table row is an existing configuration, the drop-in's entry for one
repository read back as containers/image reads the merged files."""

from __future__ import annotations

import pytest

from nodeagent.bundles.node_mirror import dropin_condition
from nodeagent.errors import RegistriesConfInvalid
from nodeagent.registries import Mirror, RegistryEntry, read_registries_conf
from nodeagent.registries.dropin import (
    NODE_MIRROR_HEADER,
    blocked_sources,
    is_mirrorable,
    render_mirror_dropin,
)

NODE = "127.0.0.1:22626"


def ours(path: str, policy: str = "digest-only") -> Mirror:
    return Mirror(f"{NODE}/{path}", True, policy)


def merged(existing: str, repository: str, tagged: tuple[str, ...] = ()) -> RegistryEntry:
    conf = read_registries_conf([("registries.conf", existing)])
    text = render_mirror_dropin([repository], NODE, conf, tagged=tagged, header=NODE_MIRROR_HEADER)
    read = read_registries_conf([("registries.conf", existing), ("98-node.conf", text)])
    return next(e for e in read.entries if e.key == repository)


IDMS = """
[[registry]]
prefix = "quay.io/openshift-release-dev/ocp-release"
location = "quay.io/openshift-release-dev/ocp-release"
blocked = true

[[registry.mirror]]
location = "mirror.site:5000/ocp/release"
pull-from-mirror = "digest-only"
"""
ICSP = """
[[registry]]
prefix = ""
location = "quay.io/openshift-release-dev"
mirror-by-digest-only = true

[[registry.mirror]]
location = "mirror.site:5000/ocp"
insecure = true
"""
ITMS = """
[[registry]]
prefix = ""
location = "registry.redhat.io/redhat"

[[registry.mirror]]
location = "mirror.site/redhat"
pull-from-mirror = "tag-only"
"""
WILDCARD = """
[[registry]]
prefix = "*.corp.example"
insecure = true

[[registry.mirror]]
location = "cache.corp.example/all"
"""
HUB = """
[[registry]]
prefix = "docker.io"
location = "docker.io"

[[registry.mirror]]
location = "hub-cache.site/docker"
"""

TABLE = {
    "no entry": (
        "", "quay.io/org/app",
        RegistryEntry("quay.io/org/app", "quay.io/org/app", mirrors=(ours("org/app"),))),
    "IDMS, NeverContactSource": (
        IDMS, "quay.io/openshift-release-dev/ocp-release",
        RegistryEntry(
            "quay.io/openshift-release-dev/ocp-release",
            "quay.io/openshift-release-dev/ocp-release",
            is_blocked=True,
            mirrors=(ours("openshift-release-dev/ocp-release"),
                     Mirror("mirror.site:5000/ocp/release", False, "digest-only")))),
    "ICSP: mirror-by-digest-only becomes per-mirror": (
        ICSP, "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
        RegistryEntry(
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
            mirrors=(ours("openshift-release-dev/ocp-v4.0-art-dev"),
                     Mirror("mirror.site:5000/ocp/ocp-v4.0-art-dev", True, "digest-only")))),
    "ITMS tag-only kept": (
        ITMS, "registry.redhat.io/redhat/redhat-operator-index",
        RegistryEntry(
            "registry.redhat.io/redhat/redhat-operator-index",
            "registry.redhat.io/redhat/redhat-operator-index",
            mirrors=(ours("redhat/redhat-operator-index"),
                     Mirror("mirror.site/redhat/redhat-operator-index", False, "tag-only")))),
    "wildcard prefix, insecure": (
        WILDCARD, "reg.corp.example/team/app",
        RegistryEntry(
            "reg.corp.example/team/app", "reg.corp.example/team/app", is_insecure=True,
            mirrors=(ours("team/app"), Mirror("cache.corp.example/all/team/app")))),
    "Docker Hub name": (
        HUB, "docker.io/library/busybox",
        RegistryEntry(
            "docker.io/library/busybox", "docker.io/library/busybox",
            mirrors=(ours("library/busybox"), Mirror("hub-cache.site/docker/library/busybox")))),
}  # fmt: skip


@pytest.mark.parametrize("row", sorted(TABLE))
def test_the_entry_restates_the_existing_one_after_the_node_mirror(row: str) -> None:
    existing, repository, expected = TABLE[row]
    entry = merged(existing, repository)
    assert entry == expected
    assert not entry.is_mirror_by_digest_only  # the per-mirror form only, always


def test_a_tagged_repository_gets_the_node_mirror_a_second_time_for_tags_only() -> None:
    entry = merged(IDMS, "quay.io/openshift-release-dev/ocp-release", tagged=(
        "quay.io/openshift-release-dev/ocp-release",))  # fmt: skip
    assert entry.mirrors[:2] == (
        ours("openshift-release-dev/ocp-release"),
        ours("openshift-release-dev/ocp-release", "tag-only"),
    )


def test_a_blocked_source_is_named_no_fallback() -> None:
    conf = read_registries_conf([("registries.conf", IDMS + ICSP)])
    held = ["quay.io/openshift-release-dev/ocp-release", "quay.io/openshift-release-dev/x"]
    assert blocked_sources(held, conf) == ("quay.io/openshift-release-dev/ocp-release",)


@pytest.mark.parametrize(
    "name",
    ['quay.io/a"\nblocked = true', "quay.io", "Quay.io/a", "quay.io/A", "quay.io/a b",
     "quay.io/a/../b", "http://quay.io/a", "quay.io/a@sha256:00", ""],
)  # fmt: skip
def test_a_name_that_is_no_normalized_repository_is_never_rendered(name: str) -> None:
    assert not is_mirrorable(name)
    with pytest.raises(ValueError, match="HOST/REPOSITORY"):
        render_mirror_dropin([name], NODE)


def test_an_ipv6_loopback_mirror_is_accepted() -> None:
    text = render_mirror_dropin(["quay.io/a"], "[::1]:22626")
    assert 'location = "[::1]:22626/a"' in text


def test_an_existing_file_mixing_both_forms_is_refused_as_containers_image_refuses_it() -> None:
    mixed = ICSP.replace("insecure = true", 'pull-from-mirror = "digest-only"')
    with pytest.raises(RegistriesConfInvalid, match="refuses the two forms together"):
        read_registries_conf([("registries.conf", mixed)])


def test_the_condition_names_blocked_sources_and_a_refusal() -> None:
    blocked = [f"quay.io/org/app-{i}" for i in range(7)]
    shown = dropin_condition("wrote", 9, blocked)
    assert (shown.type, shown.is_true, shown.reason) == ("MirrorDropin", True, "SourceBlocked")
    assert "quay.io/org/app-4" in shown.message and "and 2 more" in shown.message
    assert "no fallback to the source" in shown.message
    assert dropin_condition("unchanged", 3).reason == "Current"
    assert dropin_condition("absent", 0).reason == "NoDropin"
    refused = dropin_condition("refused", 3, reason="RegistriesConfInvalid", message="x" * 900)
    assert (refused.is_true, refused.reason) == (False, "RegistriesConfInvalid")
    assert len(refused.message) < 600  # clipped
