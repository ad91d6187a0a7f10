"""The bundle manifest and the rules for a bundle's file tree (docs/bundle-format.md, rules).

Test ids name the rule they prove (``R6`` is rule 6 of the format's rules table); the
test in test_format_doc.py checks that every rule has one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import tree_rules
from nodeagent.bundles.tree_rules import TreeEntry

HEX_A, HEX_B, HEX_C = "a" * 64, "b" * 64, "c" * 64
REF = f"quay.io/acme/app@sha256:{HEX_A}"
OTHER = f"quay.io/acme/other@sha256:{HEX_B}"


def set_object(name: str = "apps", images: list[str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name},
        "spec": {"pinnedImages": [{"name": ref} for ref in images or [REF]]},
    }


def manifest_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "formatVersion": 1,
        "bundleId": "line-3.2026-11-22",
        "created": "2026-11-22T09:30:00Z",
        "architecture": "amd64",
        "layout": "oci",
        "images": [{"name": REF, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 300}],
        "blobs": [
            {"digest": f"sha256:{HEX_A}", "sizeBytes": 100},
            {"digest": f"sha256:{HEX_B}", "sizeBytes": 200},
        ],
        "files": [
            {"path": "oci-layout", "sha256": HEX_C, "sizeBytes": 30},
            {"path": "index.json", "sha256": HEX_C, "sizeBytes": 40},
        ],
        "pinnedImageSets": [{"persistent": True, "object": set_object()}],
    }
    doc.update(changes)
    return doc


def parse(doc: dict[str, Any]) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(doc).encode())


def good_tree() -> list[TreeEntry]:
    return [
        TreeEntry("bundle.json", "file", 900),
        TreeEntry("bundle.json.minisig", "file", 300),
        TreeEntry("oci-layout", "file", 30),
        TreeEntry("index.json", "file", 40),
        TreeEntry("blobs", "dir"),
        TreeEntry("blobs/sha256", "dir"),
        TreeEntry(f"blobs/sha256/{HEX_A}", "file", 100),
        TreeEntry(f"blobs/sha256/{HEX_B}", "file", 200),
    ]


def test_parse_good_manifest() -> None:
    m = parse(manifest_doc())
    assert m.bundle_id == "line-3.2026-11-22"
    assert [str(i.ref) for i in m.images] == [REF]
    assert [f.path for f in m.files] == [
        f"blobs/sha256/{HEX_A}",
        f"blobs/sha256/{HEX_B}",
        "index.json",
        "oci-layout",
    ]
    assert sorted(m.blobs) == [f"sha256:{HEX_A}", f"sha256:{HEX_B}"]
    assert m.total_size_bytes == 370
    assert (m.sets[0].is_persistent, m.sets[0].name) == (True, "apps")
    assert m.sets[0].object == set_object()


def test_unknown_fields_are_ignored_and_layout_defaults_to_oci() -> None:
    doc = manifest_doc(comment={"any": ["thing"]})
    del doc["layout"]
    assert parse(doc).layout == "oci"


def test_R8_channel_is_optional_defaults_and_has_its_form() -> None:
    assert parse(manifest_doc()).channel == bundle.DEFAULT_CHANNEL == "default"
    assert parse(manifest_doc(channel="stable-4.16")).channel == "stable-4.16"
    for bad in ("", "a/b", "x" * 65, 4, None):
        with pytest.raises(bundle.BundleManifestInvalid, match="channel"):
            parse(manifest_doc(channel=bad))


def test_registry_v2_layout_places_blobs_in_data_files() -> None:
    m = parse(manifest_doc(layout="registry-v2", files=[]))
    assert f"docker/registry/v2/blobs/sha256/aa/{HEX_A}/data" in [f.path for f in m.files]


def test_set_object_is_exactly_what_was_checked() -> None:
    obj = set_object()
    obj["metadata"] |= {"labels": {"site": "line-3"}, "generation": 4}
    m = parse(manifest_doc(pinnedImageSets=[{"persistent": False, "object": obj}]))
    assert m.sets[0].object["metadata"] == {"name": "apps", "labels": {"site": "line-3"}}


def _raw(text: bytes) -> bytes:
    return text


GOOD = json.dumps(manifest_doc()).encode()
FILE = {"sha256": HEX_C, "sizeBytes": 1}
IMAGE = {"name": REF, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 1}


@pytest.mark.parametrize(
    ("data", "reason", "needle"),
    [
        pytest.param(b"\xff not json", "BundleManifestInvalid", "UTF-8", id="R6-not-utf8"),
        pytest.param(GOOD.decode().encode("utf-16"), "BundleManifestInvalid", "UTF-16",
                     id="R6-utf16"),
        pytest.param(GOOD.replace(b'"sizeBytes": 300', b'"sizeBytes": NaN'),
                     "BundleManifestInvalid", "NaN", id="R6-nan"),
        pytest.param(GOOD.replace(b"{", b'{"bundleId": "x", ', 1), "BundleManifestInvalid",
                     "duplicate key", id="R6-duplicate-key"),
        pytest.param(GOOD.replace(b'"line-3', b'"\\ud800line-3'), "BundleManifestInvalid",
                     "surrogate", id="R6-lone-surrogate"),
        pytest.param(GOOD.replace(b"300", b"3" * 4301), "BundleManifestInvalid", "4301 digits",
                     id="R6-long-integer"),
        pytest.param(GOOD.replace(b"{", b'{"x": ' + b"[" * 17 + b"]" * 17 + b",", 1),
                     "BundleManifestInvalid", "nested 18 deep", id="R6-depth"),
        pytest.param(b"[1]", "BundleManifestInvalid", "object", id="R6-not-an-object"),
        pytest.param(GOOD.replace(b"{", b'{"x": [' + b"[]," * 250_000 + b"[]],", 1),
                     "BundleManifestInvalid", "more than 250000 values", id="R6-values"),
    ],
)  # fmt: skip
def test_strict_json(data: bytes, reason: str, needle: str) -> None:
    with pytest.raises(bundle.BundleError) as info:
        bundle.parse_manifest(data)
    assert (info.value.reason, needle in info.value.message) == (reason, True), info.value


@pytest.mark.parametrize(
    ("changes", "reason", "needle"),
    [
        pytest.param({"formatVersion": 4}, "BundleFormatUnsupported", "version 4", id="R7-four"),
        pytest.param({"formatVersion": True}, "BundleManifestInvalid", "integer 1",
                     id="R7-true"),
        pytest.param({"formatVersion": 1.0}, "BundleManifestInvalid", "integer 1", id="R7-float"),
        pytest.param({"formatVersion": "1"}, "BundleManifestInvalid", "integer 1",
                     id="R7-string"),
        pytest.param({"formatVersion": None}, "BundleManifestInvalid", "integer 1", id="R7-null"),
        pytest.param({"bundleId": "a/b"}, "BundleManifestInvalid", "bundleId", id="R8-bundle-id"),
        pytest.param({"created": "yesterday"}, "BundleManifestInvalid", "RFC 3339",
                     id="R8-created"),
        pytest.param({"created": "2026-11-22T09:30:00Z\x1b[2J"}, "BundleManifestInvalid",
                     "\\x1b[2J", id="R8-created-escapes"),
        pytest.param({"architecture": "AMD64 "}, "BundleManifestInvalid", "GOARCH",
                     id="R8-architecture"),
        pytest.param({"layout": ["oci"]}, "BundleManifestInvalid", "layout", id="R8-layout"),
        pytest.param({"images": {"a": 1}}, "BundleManifestInvalid", "must be a list",
                     id="R8-images-list"),
        pytest.param({"images": [1]}, "BundleManifestInvalid", "must be an object",
                     id="R8-image-object"),
        pytest.param({"blobs": "all"}, "BundleManifestInvalid", "must be a list",
                     id="R8-blobs-list"),
        pytest.param({"files": None}, "BundleManifestInvalid", "not null", id="R8-files-list"),
        pytest.param({"pinnedImageSets": {"a": 1}}, "BundleManifestInvalid", "must be a list",
                     id="R8-sets-list"),
        pytest.param({"blobs": [{"digest": "sha256:xyz", "sizeBytes": 1}]},
                     "BundleManifestInvalid", "digest", id="R8-digest"),
        pytest.param({"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": -1}]},
                     "BundleManifestInvalid", "0 to", id="R8-negative-size"),
        pytest.param({"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": True}]},
                     "BundleManifestInvalid", "an integer, not a boolean", id="R8-size-bool"),
        pytest.param({"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": 1 << 63}]},
                     "BundleManifestInvalid", "0 to", id="R8-size-too-big"),
        pytest.param({"images": []}, "BundleManifestInvalid", "no images", id="R9-no-images"),
        pytest.param({"images": [{**IMAGE, "name": "quay.io/a/b:1"}]}, "BundleManifestInvalid",
                     "tag", id="R9-tag"),
        pytest.param({"images": [{**IMAGE, "manifestDigest": f"sha256:{HEX_B}"}]},
                     "BundleManifestInvalid", "not the digest of its name", id="R9-digest"),
        pytest.param({"images": [IMAGE, IMAGE]}, "BundleManifestInvalid", "listed twice",
                     id="R9-twice"),
        pytest.param({"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": 1}] * 2},
                     "BundleManifestInvalid", "listed twice", id="R10-blob-twice"),
        pytest.param({"files": [{"path": "../etc/passwd", **FILE}]}, "BundleUnsafePath",
                     "../etc/passwd", id="R11-dotdot"),
        pytest.param({"files": [{"path": "/etc/passwd", **FILE}]}, "BundleUnsafePath",
                     "/etc/passwd", id="R11-absolute"),
        pytest.param({"files": [{"path": "a\\b", **FILE}]}, "BundleUnsafePath", "'a\\b'",
                     id="R11-backslash"),
        pytest.param({"files": [{"path": "a/" + "n" * 256, **FILE}]}, "BundleUnsafePath",
                     "unsafe", id="R11-long-name"),
        pytest.param({"files": [{"path": "a/" * 600, **FILE}]}, "BundleUnsafePath", "unsafe",
                     id="R11-long-path"),
        pytest.param({"files": [{"path": "bundle.json", **FILE}]}, "BundleManifestInvalid",
                     "twice", id="R11-manifest-as-file"),
        pytest.param({"files": [{"path": "x", **FILE}, {"path": "x", **FILE}]},
                     "BundleManifestInvalid", "twice", id="R11-file-twice"),
        pytest.param({"files": [{"path": f"blobs/sha256/{HEX_C}", **FILE}]},
                     "BundleManifestInvalid", "blob's place", id="R11-blob-place"),
        pytest.param({"files": [{"path": "x", "sha256": "ABC", "sizeBytes": 1}]},
                     "BundleManifestInvalid", "hex", id="R11-sha256"),
    ],
)  # fmt: skip
def test_fields(changes: dict[str, Any], reason: str, needle: str) -> None:
    with pytest.raises(bundle.BundleError) as info:
        parse(manifest_doc(**changes))
    assert (info.value.reason, needle in info.value.message) == (reason, True), info.value


def labelled(labels: dict[str, str]) -> dict[str, Any]:
    obj = set_object()
    obj["metadata"]["labels"] = labels
    return obj


def test_R12_kubernetes_labels_are_kept() -> None:
    labels = {"site": "line-3", "example.com/role": "", "a": "b.c_d-e"}
    m = parse(manifest_doc(pinnedImageSets=[{"persistent": True, "object": labelled(labels)}]))
    assert m.sets[0].object["metadata"]["labels"] == labels


def _sets(*items: Any) -> dict[str, Any]:
    return {"pinnedImageSets": list(items)}


@pytest.mark.parametrize(
    ("changes", "reason", "needle"),
    [
        pytest.param(_sets({"persistent": 1, "object": set_object()}), "BundleManifestInvalid",
                     "persistent must be a boolean", id="R12-persistent"),
        pytest.param(_sets({"persistent": True, "object": "x"}), "BundleSetInvalid",
                     "not an object", id="R12-object"),
        pytest.param(_sets({"persistent": True, "object": set_object("x/../../outside")}),
                     "BundleSetInvalid", "DNS subdomain", id="R12-traversal-name"),
        pytest.param(_sets({"persistent": True, "object": set_object("Apps")}),
                     "BundleSetInvalid", "DNS subdomain", id="R12-upper-case"),
        pytest.param(_sets({"persistent": True, "object": set_object("a" * 254)}),
                     "BundleSetInvalid", "DNS subdomain", id="R12-254-characters"),
        pytest.param(_sets({"persistent": True, "object": {**set_object(), "spec": []}}),
                     "BundleSetInvalid", "spec must be a mapping", id="R12-spec"),
        pytest.param(_sets({"persistent": True, "object": {**set_object(), "kind": "Pod"}}),
                     "BundleSetInvalid", "not a PinnedImageSet", id="R12-kind"),
        pytest.param(_sets(*[{"persistent": True, "object": set_object()}] * 2),
                     "BundleSetInvalid", "carried twice", id="R12-twice"),
        pytest.param(_sets({"persistent": True, "object": set_object(images=[REF, OTHER])}),
                     "BundleSetInvalid", "does not carry", id="R12-image-not-carried"),
        pytest.param(_sets({"persistent": True, "object": set_object(images=["q.io/a:1"])}),
                     "BundleSetInvalid", "tag", id="R12-tag"),
        pytest.param(_sets({"persistent": True, "object": labelled({"site": "x" * 64})}),
                     "BundleSetInvalid", "Kubernetes label", id="R12-label-value"),
        pytest.param(_sets({"persistent": True, "object": labelled({"a b": "x"})}),
                     "BundleSetInvalid", "Kubernetes label", id="R12-label-name"),
        pytest.param(_sets({"persistent": True, "object": labelled({"Ex.com/a": "x"})}),
                     "BundleSetInvalid", "Kubernetes label", id="R12-label-prefix"),
    ],
)  # fmt: skip
def test_pinned_image_sets(changes: dict[str, Any], reason: str, needle: str) -> None:
    with pytest.raises(bundle.BundleError) as info:
        parse(manifest_doc(**changes))
    assert (info.value.reason, needle in info.value.message) == (reason, True), info.value


def test_R27_bundle_text_in_messages_is_clipped_and_escaped() -> None:
    for changes in (
        {"bundleId": "\x1b]0;x\x07" + "a" * 10_000_000},
        {"formatVersion": [[["x" * 1000] * 100] * 10]},
        _sets({"persistent": True, "object": set_object("\x1b[2J" + "b" * 5_000_000)}),
        {"files": [{"path": "\x1b[2J/" + "c" * 4000, **FILE}]},
    ):
        with pytest.raises(bundle.BundleError) as info:
            parse(manifest_doc(**changes))
        assert len(info.value.message) < 1000
        assert "\x1b" not in info.value.message


def test_R26_file_names_to_write() -> None:
    assert bundle.check_file_name("bundle-x-apps.yaml") == "bundle-x-apps.yaml"
    for bad in ("", ".", "..", "a/b", "a\0b", "n" * 256):
        with pytest.raises(bundle.BundleUnsafePath):
            bundle.check_file_name(bad)


# ---------------------------------------------------------------- the tree
def test_good_tree_passes() -> None:
    tree_rules.check_tree(good_tree(), parse(manifest_doc()))


@pytest.mark.parametrize("name", sorted(tree_rules.METADATA_DIRS))
def test_R15_empty_metadata_directories_at_the_root_are_ignored(name: str) -> None:
    tree_rules.check_tree([*good_tree(), TreeEntry(name, "dir")], parse(manifest_doc()))


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        pytest.param(TreeEntry("extra.sh", "file", 10), "BundleUnlistedFile", id="R15-file"),
        pytest.param(TreeEntry("blobs/sha512", "dir"), "BundleUnlistedFile", id="R15-directory"),
        pytest.param(TreeEntry("blobs/sha256/../x", "file", 10), "BundleUnlistedFile",
                     id="R15-dotdot"),
        pytest.param(TreeEntry("blobs/lost+found", "dir"), "BundleUnlistedFile",
                     id="R15-lost-found-below-root"),
        pytest.param(TreeEntry("lost+found/#1234", "file", 5), "BundleUnlistedFile",
                     id="R15-inside-lost-found"),
        pytest.param(TreeEntry("System Volume Information/x", "file", 5), "BundleUnlistedFile",
                     id="R15-inside-system-volume-information"),
        pytest.param(TreeEntry("lost+found", "file", 5), "BundleUnlistedFile",
                     id="R15-lost-found-file"),
        pytest.param(TreeEntry("link", "symlink"), "BundleUnsafeEntry", id="R14-symlink"),
        pytest.param(TreeEntry("dev", "other"), "BundleUnsafeEntry", id="R14-special"),
        pytest.param(TreeEntry("lost+found", "symlink"), "BundleUnsafeEntry",
                     id="R14-lost-found-symlink"),
    ],
)  # fmt: skip
def test_unsafe_or_unlisted_entries_are_refused(entry: TreeEntry, reason: str) -> None:
    with pytest.raises(bundle.BundleError) as info:
        tree_rules.check_tree([*good_tree(), entry], parse(manifest_doc()))
    assert info.value.reason == reason


def test_R16_wrong_size_and_missing_file_are_refused() -> None:
    m = parse(manifest_doc())
    tree = good_tree()
    tree[-1] = TreeEntry(f"blobs/sha256/{HEX_B}", "file", 199)
    with pytest.raises(bundle.BundleSizeMismatch, match="199 bytes"):
        tree_rules.check_tree(tree, m)
    with pytest.raises(bundle.BundleIncomplete, match=HEX_B):
        tree_rules.check_tree(good_tree()[:-1], m)


def test_R16_a_listed_file_that_is_a_directory_is_missing() -> None:
    """A manifest listing ``a`` and ``a/0`` cannot be met: ``a`` is a directory on the medium,
    which is not the file it lists (found by tests/fuzz/test_bundle_tree.py; it passed)."""
    doc = manifest_doc()
    doc["files"] = [{"path": "a", "sha256": "c" * 64, "sizeBytes": 0},
                    {"path": "a/0", "sha256": "c" * 64, "sizeBytes": 0}]  # fmt: skip
    m = parse(doc)
    tree = [e for e in good_tree() if e.path not in ("oci-layout", "index.json")]
    tree += [TreeEntry("a", "dir"), TreeEntry("a/0", "file", 0)]
    with pytest.raises(bundle.BundleIncomplete, match="first a;"):
        tree_rules.check_tree(tree, m)


def test_R17_the_tree_is_checked_as_it_comes() -> None:
    """The first unlisted entry ends the check: nothing after it is asked for."""
    asked: list[str] = []

    def walk() -> Any:
        for entry in [
            TreeEntry("junk", "dir"),
            *(TreeEntry(f"junk/{n}", "file") for n in range(9)),
        ]:
            asked.append(entry.path)
            yield entry

    with pytest.raises(bundle.BundleUnlistedFile):
        tree_rules.check_tree(walk(), parse(manifest_doc()))
    assert asked == ["junk"]


def test_R25_check_digest() -> None:
    file = bundle.ExpectedFile("blobs/sha256/" + HEX_A, 1, HEX_A)
    tree_rules.check_digest(file, HEX_A)
    with pytest.raises(bundle.BundleDigestMismatch) as info:
        tree_rules.check_digest(file, HEX_B)
    assert info.value.reason == "BundleDigestMismatch"
