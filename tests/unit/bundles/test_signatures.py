"""Image signatures in bundle.json (rule R36), the mirror's signature tags (R37), and what
registries.d says about sigstore attachments (docs/bundle-format.md, "Image signatures")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from nodeagent.bundles import content
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.mirror import ErrorAnswer, Fetch, Request, route
from nodeagent.bundles.signatures import (
    AttachmentScopes,
    ImageSignature,
    parse_registries_d,
    scope_names,
    served_tags,
    signature_tag,
    sigstore_findings,
    tag_digest,
    uses_sigstore_attachments,
)
from nodeagent.references import parse_pinned_image_ref
from tests.unit.bundles.test_content import AMD64, OCI_INDEX, OCI_MANIFEST, Content, desc
from tests.unit.bundles.test_content import digest as cdigest
from tests.unit.bundles.test_manifest import HEX_A, HEX_B, REF, manifest_doc

HEX_S = "5" * 64
SIG = f"sha256:{HEX_S}"
TAG = f"sha256-{HEX_A}.sig"


def signed_doc(**changes: Any) -> dict[str, Any]:
    entry = {"image": REF, "tag": TAG, "manifest": SIG}
    doc = manifest_doc(formatVersion=3, sequence=1, imageSignatures=[entry])
    doc["blobs"].append({"digest": SIG, "sizeBytes": 500})
    doc.update(changes)
    return doc


def parse(doc: dict[str, Any]) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(doc).encode())


def test_a_signed_image_is_parsed_with_its_tag_and_manifest() -> None:
    found = parse(signed_doc()).image_signatures
    assert found == (ImageSignature(parse_pinned_image_ref(REF), TAG, SIG),)
    assert found[0].served_name == f"acme/app/{TAG}"
    assert served_tags(found) == {f"acme/app/{TAG}": SIG}
    assert parse(manifest_doc()).image_signatures == ()


def entry(**changes: Any) -> dict[str, Any]:
    return {"image": REF, "tag": TAG, "manifest": SIG} | changes


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        pytest.param(signed_doc(formatVersion=2), "needs formatVersion 3", id="R36-version"),
        pytest.param(signed_doc(imageSignatures={}), "must be a list", id="R36-list"),
        pytest.param(signed_doc(imageSignatures=["x"]), "must be an object", id="R36-object"),
        pytest.param(signed_doc(imageSignatures=[entry(extra=1)]), "exactly", id="R36-keys"),
        pytest.param(signed_doc(imageSignatures=[{"image": REF, "tag": TAG}]), "exactly",
                     id="R36-missing"),
        pytest.param(signed_doc(imageSignatures=[entry(image=f"quay.io/acme/x@sha256:{HEX_B}")]),
                     "not an image of the bundle", id="R36-image"),
        pytest.param(signed_doc(imageSignatures=[entry(tag=f"sha256-{HEX_B}.sig")]),
                     "is not sha256-aaaa", id="R36-tag"),
        pytest.param(signed_doc(imageSignatures=[entry(tag="latest")]), "is not", id="R36-latest"),
        pytest.param(signed_doc(imageSignatures=[entry(manifest="sha256:zz")]), "not a digest",
                     id="R36-digest"),
        pytest.param(signed_doc(imageSignatures=[entry(manifest=f"sha256:{'6' * 64}")]),
                     "not listed in blobs", id="R36-unlisted"),
        pytest.param(signed_doc(imageSignatures=[entry(), entry()]), "listed twice",
                     id="R36-twice"),
    ],
)  # fmt: skip
def test_a_bad_signature_entry_is_refused(doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(bundle.BundleManifestInvalid) as caught:
        parse(doc)
    assert fragment in caught.value.message


def test_R36_a_signature_manifest_over_4_mib_is_refused() -> None:
    doc = signed_doc()
    doc["blobs"][-1]["sizeBytes"] = (4 << 20) + 1
    with pytest.raises(bundle.BundleManifestInvalid, match="at most"):
        parse(doc)


def test_a_target_stays_readable_in_format_3() -> None:
    parsed = parse(signed_doc(target={"nodeSelector": "site=line-3"}))
    assert parsed.target is not None
    assert parsed.image_signatures


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(f"/v2/acme/app/manifests/{TAG}", Fetch("signature", f"sha256:{HEX_A}",
                     f"acme/app/{TAG}"), id="R37-tag"),
        pytest.param(f"/v2/acme/app/blobs/{TAG}", ErrorAnswer(400, "DIGEST_INVALID", ""),
                     id="R37-blob-tag"),
        # any other tag is looked up by its name among the listed ones (R42), never guessed
        pytest.param("/v2/acme/app/manifests/latest", Fetch("tag", name="acme/app/latest"),
                     id="R37-other-tag"),
        pytest.param(f"/v2/acme/app/manifests/sha256-{HEX_A.upper()}.sig",
                     Fetch("tag", name=f"acme/app/sha256-{HEX_A.upper()}.sig"), id="R37-upper"),
        pytest.param("/v2/acme/app/manifests/.hidden", ErrorAnswer(404, "MANIFEST_UNKNOWN", ""),
                     id="R37-not-a-tag"),
        pytest.param(f"/v2/Acme/manifests/{TAG}", ErrorAnswer(400, "NAME_INVALID", ""),
                     id="R37-name"),
    ],
)  # fmt: skip
def test_the_mirror_routes_only_signature_tags(path: str, expected: Fetch | ErrorAnswer) -> None:
    found = route(Request("GET", path))
    if isinstance(expected, ErrorAnswer):
        assert isinstance(found, ErrorAnswer)
        assert (found.status, found.code) == (expected.status, expected.code)
    else:
        assert found == expected


def test_tags_and_digests() -> None:
    assert signature_tag(f"sha256:{HEX_A}") == TAG
    assert tag_digest(TAG) == f"sha256:{HEX_A}"
    assert tag_digest("sha256-abc.sig") is None
    with pytest.raises(ValueError, match="not a sha256"):
        signature_tag("latest")


# ---------------------------------------------------------------- registries.d
def test_scopes_are_tried_as_containers_image_tries_them() -> None:
    assert scope_names("quay.io:5000/acme/app", "sha256:x") == [
        "quay.io:5000/acme/app@sha256:x",
        "quay.io:5000/acme/app",
        "quay.io:5000/acme",
        "quay.io:5000",
        "*.io",
    ]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ([], False),
        ([("a.yaml", b"default-docker:\n  use-sigstore-attachments: true\n")], True),
        ([("a.yaml", b"docker:\n  quay.io:\n    use-sigstore-attachments: true\n")], True),
        ([("a.yaml", b"docker:\n  quay.io/acme:\n    use-sigstore-attachments: true\n")], True),
        ([("a.yaml", b"docker:\n  '*.io':\n    use-sigstore-attachments: true\n")], True),
        ([("a.yaml", b"docker:\n  quay.io/other:\n    use-sigstore-attachments: true\n")], False),
        # the most specific scope that sets the key decides, even against default-docker
        ([("a.yaml", b"default-docker:\n  use-sigstore-attachments: true\n"
                     b"docker:\n  quay.io/acme/app:\n    use-sigstore-attachments: false\n")],
         False),
        # a scope that does not set the key falls through to its parents
        ([("a.yaml", b"docker:\n  quay.io/acme/app:\n    lookaside: https://s\n"
                     b"  quay.io:\n    use-sigstore-attachments: true\n")], True),
        ([("a.yaml", b""), ("b.yaml", b"# only a comment\n")], False),
    ],
)  # fmt: skip
def test_uses_sigstore_attachments(files: list[tuple[str, bytes]], expected: bool) -> None:
    scopes = parse_registries_d(files)
    assert scopes.problems == ()
    assert uses_sigstore_attachments(scopes, "quay.io/acme/app", f"sha256:{HEX_A}") is expected


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ([("a.yaml", b"[1, 2]\n")], "must hold a mapping"),
        ([("a.yaml", b"docker: [1]\n")], "must map scopes"),
        ([("a.yaml", b"docker:\n  q.io:\n    use-sigstore-attachments: yes please\n")],
         "true or false"),
        ([("a.yaml", b"docker:\n  q.io: 3\n")], "must be a mapping"),
        ([("a.yaml", b"default-docker: {}\n"), ("b.yaml", b"default-docker: {}\n")],
         "default-docker is set in both a.yaml and b.yaml"),
        ([("a.yaml", b"docker:\n  q.io: {}\n"), ("b.yaml", b"docker:\n  q.io: {}\n")],
         "is set in a.yaml and b.yaml"),
        ([("a.yaml", b"a: 1\na: 2\n")], "a.yaml"),
        ([("a.yaml", b"a: 1\n---\nb: 2\n")], "2 YAML documents"),
        ([("a.yaml", b"x" * ((1 << 20) + 1))], "a.yaml"),
        ([("a.yaml", b"\xff\xfe")], "a.yaml"),
    ],
)  # fmt: skip
def test_a_registries_d_containers_image_would_refuse_is_a_problem(
    files: list[tuple[str, bytes]], fragment: str
) -> None:
    problems = parse_registries_d(files).problems
    assert problems
    assert fragment in problems[0]


def test_too_many_files_is_a_problem() -> None:
    files = [(f"{n:04}.yaml", b"{}") for n in range(300)]
    assert "more than 256 files" in parse_registries_d(files).problems[0]


def test_findings_name_each_signed_image_not_covered_and_what_to_do() -> None:
    covered = parse_pinned_image_ref(REF)
    bare = parse_pinned_image_ref(f"registry.example:5000/acme/x@sha256:{HEX_B}")
    signatures = [ImageSignature(covered, TAG, SIG), ImageSignature(bare, "t", SIG)]
    scopes = AttachmentScopes(namespaces={"quay.io": True}, problems=("a.yaml: broken",))
    found = sigstore_findings(signatures, scopes, directory="/etc/containers/registries.d")
    assert [(f.code, f.subject) for f in found] == [
        ("RegistriesDInvalid", "/etc/containers/registries.d"),
        ("SigstoreAttachmentsOff", str(bare)),
    ]
    assert "registry.example:5000: {use-sigstore-attachments: true}" in found[1].action
    assert sigstore_findings(signatures[:1], AttachmentScopes(default=True), directory="d") == []


def test_docker_hub_images_are_checked_under_docker_io() -> None:
    hub = parse_pinned_image_ref(f"index.docker.io/busybox@sha256:{HEX_A}")
    scopes = parse_registries_d(
        [("a.yaml", b"docker:\n  docker.io/library:\n    use-sigstore-attachments: true\n")]
    )
    found = sigstore_findings([ImageSignature(hub, TAG, SIG)], scopes, directory="d")
    assert found == []


# ---------------------------------------------------------------- R38: what a signature holds
SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"


def _signed_content(signature_doc: Callable[[Content], dict[str, Any]]) -> tuple[Content, Any]:
    """A one-image ``Content`` whose image carries a signature made by ``signature_doc``."""
    made = Content()
    made.size_bytes = sum(len(b) for b in made.blobs.values())
    payload, config = b'{"critical": {}}', b"{}"
    made.blobs |= {cdigest(payload): payload, cdigest(config): config}
    made.payload, made.sig_config = payload, config  # type: ignore[attr-defined]
    body = json.dumps(signature_doc(made)).encode()
    made.blobs[cdigest(body)] = body
    parsed = made.manifest()
    doc = {
        "formatVersion": 3, "sequence": 1, "bundleId": "unit", "created": "2026-01-01T00:00:00Z",
        "architecture": "amd64",
        "images": [{"name": str(parsed.images[0].ref), "manifestDigest": cdigest(made.top),
                    "sizeBytes": made.size_bytes}],
        "blobs": [{"digest": d, "sizeBytes": len(b)} for d, b in made.blobs.items()],
        "files": [{"path": f.path, "sha256": f.sha256_hex, "sizeBytes": f.size_bytes}
                  for f in parsed.files if not f.path.startswith("blobs/")],
        "imageSignatures": [{"image": str(parsed.images[0].ref),
                             "tag": signature_tag(cdigest(made.top)), "manifest": cdigest(body)}],
    }  # fmt: skip
    return made, bundle.parse_manifest(json.dumps(doc).encode())


def good_signature(made: Content) -> dict[str, Any]:
    return {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": desc(made.sig_config, "application/vnd.oci.image.config.v1+json"),  # type: ignore[attr-defined]
        "layers": [desc(made.payload, SIGNING)],  # type: ignore[attr-defined]
    }  # fmt: skip


def test_a_complete_signature_passes() -> None:
    made, parsed = _signed_content(good_signature)
    content.check_content(parsed, AMD64, made.read)


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        pytest.param(lambda d: d.pop("mediaType"), bundle.BundleManifestInvalid,
                     "not an OCI image manifest", id="R38-media-type"),
        pytest.param(lambda d: d.update(mediaType=OCI_INDEX, manifests=[]),
                     bundle.BundleManifestInvalid, "not an OCI image manifest", id="R38-index"),
        pytest.param(lambda d: d["layers"].append({"mediaType": SIGNING, "size": 3,
                     "digest": f"sha256:{'9' * 64}"}), bundle.BundleIncomplete,
                     "is not in the bundle", id="R38-unlisted-payload"),
        pytest.param(lambda d: d["layers"][0].update(size=1), bundle.BundleSizeMismatch,
                     "declares", id="R38-size"),
    ],
)  # fmt: skip
def test_a_signature_the_runtime_could_not_read_is_refused(
    change: Callable[[dict[str, Any]], object], error: type[Exception], fragment: str
) -> None:
    def changed(made: Content) -> dict[str, Any]:
        doc = good_signature(made)
        change(doc)
        return doc

    made, parsed = _signed_content(changed)
    with pytest.raises(error, match=fragment):
        content.check_content(parsed, AMD64, made.read)
