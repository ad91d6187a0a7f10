"""Fuzz: what a bundle medium holds: ``bundle.json`` (``bundles.manifest.parse_manifest``)
and its tree check, minisign signatures and public keys (``bundles.minisign``).

Contract: a value, or a ``NodeAgentError`` (``BundleManifestInvalid``, ``SignatureMalformed``,
``KeyMalformed``, …) with a clipped message; every set a manifest yields is valid.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.bundles import minisign
from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from nodeagent.bundles.target import MAX_SELECTOR_CHARS, parse_target
from nodeagent.bundles.tree_rules import TreeEntry, check_tree
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

HEX_A, HEX_B, HEX_C = "a" * 64, "b" * 64, "c" * 64
_REF = f"quay.io/acme/app@sha256:{HEX_A}"
_BUNDLE: dict[str, Any] = {
    "formatVersion": 1,
    "bundleId": "line-3.2026-11-22",
    "created": "2026-11-22T09:30:00Z",
    "architecture": "amd64",
    "layout": "oci",
    "images": [{"name": _REF, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 300}],
    "blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": 100},
              {"digest": f"sha256:{HEX_B}", "sizeBytes": 200}],
    "files": [{"path": "oci-layout", "sha256": HEX_C, "sizeBytes": 30},
              {"path": "index.json", "sha256": HEX_C, "sizeBytes": 40}],
    "pinnedImageSets": [{"persistent": True, "object": {
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
        "metadata": {"name": "apps"}, "spec": {"pinnedImages": [{"name": _REF}]}}}],
}  # fmt: skip
_PATHS: list[tuple[str | int, ...]] = [
    ("formatVersion",), ("bundleId",), ("created",), ("architecture",), ("layout",), ("images",),
    ("images", 0), ("images", 0, "name"), ("images", 0, "manifestDigest"),
    ("images", 0, "sizeBytes"), ("blobs",), ("blobs", 0), ("blobs", 0, "digest"),
    ("blobs", 1, "sizeBytes"), ("files",), ("files", 0, "path"), ("files", 1, "sha256"),
    ("files", 0, "sizeBytes"), ("pinnedImageSets",), ("pinnedImageSets", 0),
    ("pinnedImageSets", 0, "persistent"), ("pinnedImageSets", 0, "object"),
    ("pinnedImageSets", 0, "object", "metadata", "name"),
    ("pinnedImageSets", 0, "object", "spec"),
    ("pinnedImageSets", 0, "object", "spec", "pinnedImages"),
]  # fmt: skip
_TARGETED: dict[str, Any] = {
    **_BUNDLE, "formatVersion": 2,
    "target": {"nodeSelector": "node-role.kubernetes.io/worker,site=line-3"},
}  # fmt: skip
_SEQUENCED: dict[str, Any] = {
    **_BUNDLE, "formatVersion": 3, "sequence": 1795339800, "channel": "release",
    "expires": "2027-01-31T00:00:00Z",
}  # fmt: skip
_FRESHNESS_PATHS: list[tuple[str | int, ...]] = [
    ("formatVersion",),
    ("sequence",),
    ("expires",),
    ("channel",),
    ("created",),
]
_FRESHNESS_VALUES = st.sampled_from(
    [0, -1, 2**53 - 1, 2**53, 2**64, 1.0, True, None, "5", "", "2027-02-30T00:00:00Z",
     "2027-01-31T00:00:00.123456789Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
     "2027-01-31T00:00:00+01:00", "\x1b[2J", "q\ud800", "a" * 65, 1, 2, 3, 4]
)  # fmt: skip
_TARGET_PATHS: list[tuple[str | int, ...]] = [
    ("formatVersion",),
    ("target",),
    ("target", "nodeSelector"),
    ("target", "architecture"),
]
_SELECTOR_PIECES = st.sampled_from(
    ["a", "site", "x.io/", "node-role.kubernetes.io/worker", "=", "==", "!=", "!", ",", " ",
     " in ", " notin ", "(", ")", "line-3", "-", "_", ".", "/", "\x1b", "\u202e", "é", "k" * 64]
)  # fmt: skip
selectors = st.one_of(
    st.lists(_SELECTOR_PIECES, max_size=24).map("".join),
    st.text(max_size=64),
    st.integers(1, 6000).map(lambda n: "a," * n),
)
targets = st.one_of(
    st.builds(lambda sel: {"nodeSelector": sel}, selectors),
    st.dictionaries(st.sampled_from(["nodeSelector", "architecture", "nodes"]),
                    st.one_of(selectors, s.json_like), max_size=3),
    s.json_like,
)  # fmt: skip
bundles = st.one_of(
    st.just(_BUNDLE),
    st.just(_TARGETED),
    st.builds(s.replaced, st.just(_BUNDLE), st.sampled_from(_PATHS), s.json_like),
    st.builds(s.replaced, st.just(_BUNDLE), st.sampled_from(_PATHS),
              st.sampled_from(["x/../../outside", "../x", "/abs", "a" * 300, "lost+found/x",
                               "\x1b[2J", "q\ud800", 2**64, -1, 1.5, True])),
    st.builds(s.replaced, st.just(_TARGETED), st.sampled_from(_TARGET_PATHS),
              st.one_of(selectors, s.json_like, st.sampled_from([1, 2, 3]))),
    st.builds(lambda version, target: {**_BUNDLE, "formatVersion": version, "target": target},
              st.sampled_from([1, 2]), targets),
    st.just(_SEQUENCED),
    st.builds(s.replaced, st.just(_SEQUENCED), st.sampled_from(_FRESHNESS_PATHS),
              st.one_of(_FRESHNESS_VALUES, s.json_like)),
).map(lambda doc: s.utf8(json.dumps(doc, ensure_ascii=False)))  # fmt: skip


def _manifest(data: bytes) -> None:
    result = outcome("bundles.manifest.parse_manifest", lambda: parse_manifest(data))
    if isinstance(result, BundleManifest):
        for bundle_set in result.sets:
            assert len(bundle_set.image_set.images) >= 1
        if result.target is not None:  # the canonical text reads back as the same target
            text = result.target.selector_text
            assert 0 < len(text) <= MAX_SELECTOR_CHARS
            assert parse_target({"nodeSelector": text}) == result.target
        assert 0 <= result.sequence <= 2**53 - 1
        tree = [TreeEntry(f.path, "file", f.size_bytes) for f in result.files]
        outcome("bundles.tree_rules.check_tree", lambda: check_tree(tree, result))


@given(s.raw_bytes)
@example(b'{"formatVersion": NaN}')
@example(b'{"formatVersion": 1, "formatVersion": 1}')
@example(json.dumps({"formatVersion": 1}).encode("utf-16"))
@example(b'{"formatVersion": true}')
@example(b'{"formatVersion": 1, "created": "\x1b]0;x\x07' + b"A" * 100_000 + b'"}')
@example(b"[" * 100_000 + b"]" * 100_000)
@example(b'{"formatVersion": 1, "bundleId": "\\u001b[2J' + b"A" * 10_000_000 + b'"}')
def test_bundle_manifest_raw(data: bytes) -> None:
    _manifest(data)


@given(st.one_of(bundles, s.mutated(bundles)))
@example(
    s.utf8(
        json.dumps(
            s.replaced(
                _BUNDLE, ("pinnedImageSets", 0, "object", "metadata", "name"), "x/../../outside"
            )
        )
    )
)
@example(s.utf8(json.dumps(s.replaced(_BUNDLE, ("pinnedImageSets",), {"a": 1}))))
@example(s.utf8(json.dumps(s.replaced(_TARGETED, ("target", "nodeSelector"), "a in (b,,c)"))))
@example(s.utf8(json.dumps(s.replaced(_TARGETED, ("formatVersion",), 1))))
@example(s.utf8(json.dumps(s.replaced(_BUNDLE, ("pinnedImageSets", 0, "object", "spec"), 3))))
@example(s.utf8(json.dumps(s.replaced(_SEQUENCED, ("expires",), "0000-01-01T00:00:00Z"))))
@example(s.utf8(json.dumps(s.replaced(_BUNDLE, ("created",), "0001-01-01T00:00:00.5Z"))))
def test_bundle_manifest_documents(data: bytes) -> None:
    _manifest(data)


# ---------------------------------------------------------------- minisign
_PUBLIC, _SECRET = minisign.generate_keypair()
_KEY = minisign.parse_secret_key(_SECRET)
_TRUSTED = minisign.load_trusted_keys({"fuzz": _PUBLIC})
_MESSAGE = b'{"formatVersion": 1}'
_SIGNATURE = minisign.sign(_MESSAGE, _KEY, trusted_comment="timestamp:1 file:bundle.json")


def _b64_edit(line: str, edit: bytes) -> str:
    raw = bytearray(base64.b64decode(line))
    raw[: len(edit)] = edit
    return base64.b64encode(bytes(raw)).decode()


signatures = st.one_of(
    s.raw_bytes,
    s.mutated(st.just(_SIGNATURE.encode())),
    st.builds(
        lambda lines, at, edit: "\n".join(
            _b64_edit(line, edit) if i == at and i in (1, 3) else line
            for i, line in enumerate(lines)
        ).encode(),
        st.just(_SIGNATURE.splitlines()), st.integers(0, 3), st.binary(min_size=1, max_size=12),
    ),
    st.just(_SIGNATURE.replace("trusted comment: ", "trusted comment: \x1b[2J" * 500).encode()),
)  # fmt: skip


@given(signatures)
@example(b"")
@example(_SIGNATURE.encode().replace(b"\n", b"\r\n"))
@example(_SIGNATURE.encode() + b"\n" * 100_000)
def test_minisign_signature(signature: bytes) -> None:
    outcome("bundles.minisign.parse_signature", lambda: minisign.parse_signature(signature))
    outcome(
        "bundles.minisign.verify",
        lambda: minisign.verify(_MESSAGE, signature, _TRUSTED, is_legacy_allowed=False),
    )


public_keys = st.one_of(
    # Keys are read as strict UTF-8 (adapters/bundles/tree.py): no lone surrogates.
    s.text.map(lambda t: t.encode("utf-8", "replace").decode()),
    s.edited_text([_PUBLIC]),
    st.builds(lambda edit: _b64_edit(_PUBLIC.splitlines()[1], edit), st.binary(max_size=12)),
)


@given(public_keys)
@example("untrusted comment: \x1b[2J\n" + "A" * 100_000)
def test_minisign_public_key(text: str) -> None:
    outcome("bundles.minisign.parse_public_key", lambda: minisign.parse_public_key(text))
    outcome(
        "bundles.minisign.parse_public_key",
        lambda: minisign.load_trusted_keys({"fuzz": text, "other": _PUBLIC}),
    )
