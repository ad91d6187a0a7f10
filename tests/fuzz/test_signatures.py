"""Fuzz: what registries.d says about sigstore attachments (``signatures.parse_registries_d``)
and ``imageSignatures`` in ``bundle.json`` (``manifest.parse_manifest``).

Contract: registries.d always gives scopes (what the runtime would refuse is a problem, each
message short and safe); a manifest gives a value or ``BundleError`` with a clipped message.
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.bundles import manifest
from nodeagent.bundles.manifest import BundleError, parse_manifest
from nodeagent.bundles.signatures import AttachmentScopes, parse_registries_d
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_texts, outcome, reaching

HEX = "a" * 64
REF = f"quay.io/acme/app@sha256:{HEX}"
scope_keys = st.one_of(
    st.sampled_from(["quay.io", "quay.io/acme", "*.io", "127.0.0.1:5000", REF]), s.short_text
)
sections = st.one_of(
    st.fixed_dictionaries({}, optional={"use-sigstore-attachments": st.one_of(st.booleans(),
                          s.json_like), "lookaside": s.short_text}),
    s.json_like,
)  # fmt: skip
documents = st.one_of(
    st.fixed_dictionaries({}, optional={
        "default-docker": sections,
        "docker": st.one_of(st.dictionaries(scope_keys, sections, max_size=4), s.json_like),
    }),
    s.json_like,
).map(lambda doc: json.dumps(doc).encode())  # JSON is YAML  # fmt: skip
files = st.lists(
    st.tuples(st.sampled_from(["a.yaml", "b.yaml", "c.yaml"]),
              st.one_of(documents, s.raw_bytes, s.text.map(s.utf8))),
    max_size=4,
)  # fmt: skip


@given(files)
@example([("a.yaml", b"docker:\n  q.io: &a {use-sigstore-attachments: true}\n  r.io: *a\n")])
@example([("a.yaml", b"- &a [*a]\n")])
@example([("a.yaml", b"[" * 5000)])
def test_registries_d(found: list[tuple[str, bytes]]) -> None:
    result = outcome("signatures.parse_registries_d", lambda: parse_registries_d(found), allowed=())
    assert isinstance(result, AttachmentScopes)
    check_texts(result.problems, "signatures.parse_registries_d")


entries = st.one_of(
    st.fixed_dictionaries({}, optional={
        "image": st.one_of(st.just(REF), s.json_like), "tag": st.one_of(
            st.just(f"sha256-{HEX}.sig"), s.json_like),
        "manifest": st.one_of(st.just(f"sha256:{'5' * 64}"), s.json_like),
        "extra": s.json_like,
    }),
    s.json_like,
)  # fmt: skip


@given(st.one_of(st.lists(entries, max_size=4), s.json_like), st.sampled_from([1, 2, 3, 4]))
def test_image_signatures(signatures: object, version: int) -> None:
    doc = {
        "formatVersion": version, "bundleId": "b", "created": "2026-11-22T09:30:00Z",
        "architecture": "amd64",
        "images": [{"name": REF, "manifestDigest": f"sha256:{HEX}", "sizeBytes": 1}],
        "blobs": [{"digest": f"sha256:{'5' * 64}", "sizeBytes": 600}], "files": [],
        "imageSignatures": signatures,
    }  # fmt: skip
    data = json.dumps(doc).encode()
    with reaching("signatures.image_signatures_of", manifest, "image_signatures_of"):
        result = outcome("bundles.manifest.parse_manifest", lambda: parse_manifest(data),
                         allowed=(BundleError,))  # fmt: skip
    assert not isinstance(result, BaseException) or isinstance(result, BundleError)
