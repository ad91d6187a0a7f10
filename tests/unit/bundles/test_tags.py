"""``servedTags`` (rule R42), the ``--image NAME:TAG@DIGEST`` form, and the tag-only mirror
entries of the drop-in (``bundles.tags``, ``bundles.mirror``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.adapters.bundles.writer import resolve_refs
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.mirror import Fetch, Request, render_mirror_dropin, route, tag_only_mirror
from nodeagent.bundles.tags import (
    MAX_SERVED_TAGS,
    ServedTag,
    answered_tags,
    is_tag,
    served_tags_of_images,
    split_tagged,
    tag_names,
    tags_doc,
)
from nodeagent.errors import BundleTagsInvalid, ImageReferenceInvalid
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import Mirror, RegistryEntry, read_registries_conf
from tests.unit.bundles.test_manifest import HEX_A, HEX_B, OTHER, REF, manifest_doc

DIGEST_A, DIGEST_B = f"sha256:{HEX_A}", f"sha256:{HEX_B}"


def tagged_doc(tags: object, **changes: Any) -> dict[str, Any]:
    doc = manifest_doc(formatVersion=3, sequence=1, servedTags=tags)
    doc["images"].append({"name": OTHER, "manifestDigest": DIGEST_B, "sizeBytes": 200})
    doc.update(changes)
    return {key: value for key, value in doc.items() if value is not None}


def parse(doc: dict[str, Any]) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(doc).encode())


def test_a_served_tag_is_parsed_with_its_image() -> None:
    found = parse(tagged_doc({"quay.io/acme/app:v4.16": DIGEST_A})).served_tags
    assert found == (ServedTag(parse_pinned_image_ref(REF), "v4.16"),)
    assert found[0].reference == "quay.io/acme/app:v4.16"
    assert tag_names(found) == {"acme/app/v4.16": DIGEST_A}
    assert tags_doc(found) == {"quay.io/acme/app:v4.16": DIGEST_A}
    assert answered_tags((), found) == {"acme/app/v4.16": DIGEST_A}
    assert parse(manifest_doc()).served_tags == ()


def test_docker_hub_names_are_served_under_library() -> None:
    ref = parse_pinned_image_ref(f"docker.io/busybox@{DIGEST_A}")
    assert ServedTag(ref, "1.36").served_name == "library/busybox/1.36"


@pytest.mark.parametrize(
    ("tags", "changes"),
    [
        pytest.param({"quay.io/acme/app:v1": DIGEST_A}, {"formatVersion": 2, "sequence": None,
                     "target": {"nodeSelector": "a=b"}}, id="R42-format-2"),
        pytest.param([], {}, id="R42-list"),
        pytest.param({}, {}, id="R42-empty"),
        pytest.param({f"quay.io/acme/app:t{n}": DIGEST_A for n in range(MAX_SERVED_TAGS + 1)},
                     {}, id="R42-too-many"),
        pytest.param({"quay.io/acme/app": DIGEST_A}, {}, id="R42-no-tag"),
        pytest.param({"quay.io:443/acme/app": DIGEST_A}, {}, id="R42-port-is-no-tag"),
        pytest.param({"quay.io/acme/app:.hidden": DIGEST_A}, {}, id="R42-tag-grammar"),
        pytest.param({"quay.io/acme/app:-x": DIGEST_A}, {}, id="R42-tag-dash"),
        pytest.param({"quay.io/acme/app:" + "a" * 129: DIGEST_A}, {}, id="R42-tag-long"),
        pytest.param({f"quay.io/acme/app:sha256-{HEX_A}.sig": DIGEST_A}, {},
                     id="R42-sigstore-tag"),
        pytest.param({":v1": DIGEST_A}, {}, id="R42-no-name"),
        pytest.param({"quay.io/acme/app:v1": "latest"}, {}, id="R42-not-a-digest"),
        pytest.param({"quay.io/acme/app:v1": 5}, {}, id="R42-digest-type"),
        pytest.param({"quay.io/acme/app:v1": DIGEST_B}, {}, id="R42-other-repository"),
        pytest.param({"quay.io/acme/app:v1": f"sha256:{'c' * 64}"}, {}, id="R42-not-carried"),
        pytest.param({"quay.io/acme/nope:v1": DIGEST_A}, {}, id="R42-unknown-repository"),
        pytest.param({"QUAY.io/acme/app:v1": DIGEST_A}, {}, id="R42-spelling"),
        pytest.param({"x" * 600 + ":v1": DIGEST_A}, {}, id="R42-key-long"),
    ],
)  # fmt: skip
def test_served_tags_that_break_the_rule_are_refused(tags: object, changes: dict[str, Any]) -> None:
    with pytest.raises(BundleTagsInvalid):
        parse(tagged_doc(tags, **changes))


def test_R42_a_repository_may_serve_several_tags_of_its_images() -> None:
    tags = {"quay.io/acme/app:v1": DIGEST_A, "quay.io/acme/app:stable": DIGEST_A,
            "quay.io/acme/other:v1": DIGEST_B}  # fmt: skip
    assert len(parse(tagged_doc(tags)).served_tags) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"quay.io/acme/app:v4.16@{DIGEST_A}", (f"quay.io/acme/app@{DIGEST_A}", "v4.16")),
        (f"127.0.0.1:5000/acme/app:v1@{DIGEST_A}", (f"127.0.0.1:5000/acme/app@{DIGEST_A}", "v1")),
        (f"127.0.0.1:5000/acme/app@{DIGEST_A}", (f"127.0.0.1:5000/acme/app@{DIGEST_A}", None)),
        ("quay.io/acme/app:v1", ("quay.io/acme/app:v1", None)),
    ],
)
def test_split_tagged(text: str, expected: tuple[str, str | None]) -> None:
    assert split_tagged(text) == expected


def test_is_tag() -> None:
    assert is_tag("v4.16") and is_tag("_x") and is_tag("a" * 128)
    assert not any(map(is_tag, ["", ".x", "-x", "a" * 129, "a/b", "a:b", f"sha256-{HEX_A}.sig"]))


def test_image_options_name_tags_only_with_serve_tags() -> None:
    tagged = f"quay.io/acme/app:v1@{DIGEST_A}"
    with pytest.raises(ImageReferenceInvalid, match="--serve-tags"):
        resolve_refs([tagged], [])
    assert [str(r) for r in resolve_refs([tagged], [], is_serving_tags=True)] == [REF]
    assert served_tags_of_images([tagged, REF]) == [ServedTag(parse_pinned_image_ref(REF), "v1")]
    with pytest.raises(ImageReferenceInvalid, match="two digests"):
        served_tags_of_images([tagged, f"quay.io/acme/app:v1@{DIGEST_B}"])
    with pytest.raises(ImageReferenceInvalid, match="tag must be"):
        served_tags_of_images([f"quay.io/acme/app:.x@{DIGEST_A}"])


def test_the_mirror_routes_a_tag_by_its_repository_and_name() -> None:
    assert route(Request("HEAD", "/v2/acme/app/manifests/v4.16")) == Fetch(
        "tag", name="acme/app/v4.16"
    )
    blob = route(Request("GET", "/v2/acme/app/blobs/v4.16"))
    assert not isinstance(blob, Fetch)


# ------------------------------------------------------------------ tag-only mirror entries
HOST = "127.0.0.1:41000"
DIGEST_MIRROR = Mirror(f"{HOST}/org/app", True, "digest-only")
TAG_MIRROR = Mirror(f"{HOST}/org/app", True, "tag-only")


def entry_for(existing: str, *, tagged: bool) -> RegistryEntry:
    conf = read_registries_conf([("registries.conf", existing)])
    text = render_mirror_dropin(
        ["quay.io/org/app"], HOST, conf, tagged=["quay.io/org/app"] if tagged else []
    )
    (entry,) = read_registries_conf([("registries.conf", ""), ("99.conf", text)]).entries
    return entry


def test_tag_only_mirror_table() -> None:
    assert tag_only_mirror("quay.io/org/app", HOST) == [
        "[[registry.mirror]]",
        f'location = "{HOST}/org/app"',
        "insecure = true",
        'pull-from-mirror = "tag-only"',
        "",
    ]
    with pytest.raises(ValueError):
        tag_only_mirror("quay.io", HOST)


def test_a_tagged_repository_gets_a_tag_only_mirror_after_the_digest_one() -> None:
    assert entry_for("", tagged=True).mirrors == (DIGEST_MIRROR, TAG_MIRROR)
    assert entry_for("", tagged=False).mirrors == (DIGEST_MIRROR,)


def test_a_tagged_repository_is_mirrored_even_when_not_listed_as_a_repository() -> None:
    text = render_mirror_dropin([], HOST, tagged=["quay.io/org/app"])
    (entry,) = read_registries_conf([("99.conf", text)]).entries
    assert entry.mirrors == (DIGEST_MIRROR, TAG_MIRROR)


def test_mirror_by_digest_only_becomes_the_same_policy_per_mirror() -> None:
    existing = """
[[registry]]
prefix = "quay.io/org/app"
location = "quay.io/org/app"
mirror-by-digest-only = true

[[registry.mirror]]
location = "mirror.site:5000/org/app"
"""
    untagged = entry_for(existing, tagged=False)
    # written per mirror whether tagged or not (decision 0058): the same pulls, one form
    assert not untagged.is_mirror_by_digest_only
    assert untagged.mirrors == (
        DIGEST_MIRROR,
        Mirror("mirror.site:5000/org/app", False, "digest-only"),
    )
    tagged = entry_for(existing, tagged=True)
    # containers/image refuses pull-from-mirror beside mirror-by-digest-only: never mixed
    assert not tagged.is_mirror_by_digest_only
    assert tagged.mirrors == (
        DIGEST_MIRROR,
        TAG_MIRROR,
        Mirror("mirror.site:5000/org/app", False, "digest-only"),
    )


def test_existing_mirrors_keep_their_policies_after_ours() -> None:
    existing = """
[[registry]]
prefix = "quay.io/org"
location = "quay.io/org"
blocked = true

[[registry.mirror]]
location = "mirror.site:5000/org"
pull-from-mirror = "tag-only"
"""
    entry = entry_for(existing, tagged=True)
    assert entry.is_blocked
    assert entry.mirrors == (
        DIGEST_MIRROR,
        TAG_MIRROR,
        Mirror("mirror.site:5000/org/app", False, "tag-only"),
    )
