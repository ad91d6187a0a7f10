"""check-offline's registries.d check and the signatures the node holds: the check over
``bundles.signatures.sigstore_findings`` (through ``adapters.offline.sigstore_issues``, over a
registries.d directory in the test's tmp dir), and ``SignaturesRequired`` only for images whose
signatures the node does not hold."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nodeagent.adapters.offline import sigstore_issues
from nodeagent.bundles.signatures import ImageSignature, signature_manifest_blobs, signature_tag
from nodeagent.offline import findings as f
from nodeagent.offline.checks import run_checks
from nodeagent.offline.facts import Facts, SignaturePolicy, SigstoreIssue
from nodeagent.references import parse_pinned_image_ref
from tests.unit.offline.test_checks import A, B, ready_facts

SIG_MANIFEST = "sha256:" + "d" * 64


def signed(ref: str) -> ImageSignature:
    image = parse_pinned_image_ref(ref)
    return ImageSignature(image, signature_tag(image.digest), SIG_MANIFEST)


def found(facts: Facts) -> list[tuple[str, str]]:
    return [(x.reason, x.subject) for x in run_checks(facts).findings]


def issues(directory: Path, refs: list[str]) -> tuple[SigstoreIssue, ...]:
    return sigstore_issues(directory, [signed(ref) for ref in refs])


def test_a_signed_image_without_attachments_is_a_finding(tmp_path: Path) -> None:
    directory = tmp_path / "registries.d"
    facts = dataclasses.replace(ready_facts(), sigstore=issues(directory, [A]))
    assert found(facts) == [(f.SIGSTORE_ATTACHMENTS_OFF, A)]
    message = run_checks(facts).findings[0]
    assert "use-sigstore-attachments" in message.remedy
    assert str(directory) in message.remedy


@pytest.mark.parametrize(
    "text",
    [
        "docker:\n  quay.example.com:\n    use-sigstore-attachments: true\n",
        "docker:\n  quay.example.com/apps:\n    use-sigstore-attachments: true\n",
        "docker:\n  '*.example.com':\n    use-sigstore-attachments: true\n",
        "default-docker:\n  use-sigstore-attachments: true\n",
    ],
)
def test_attachments_on_for_the_scope_clear_it(tmp_path: Path, text: str) -> None:
    directory = tmp_path / "registries.d"
    directory.mkdir()
    (directory / "50-sigstore.yaml").write_text(text)
    facts = dataclasses.replace(ready_facts(), sigstore=issues(directory, [A, B]))
    assert found(facts) == []


def test_attachments_on_for_another_registry_do_not(tmp_path: Path) -> None:
    directory = tmp_path / "registries.d"
    directory.mkdir()
    (directory / "50.yaml").write_text(
        "docker:\n  registry.example.org:\n    use-sigstore-attachments: true\n"
        "  quay.example.com/apps/a:\n    use-sigstore-attachments: false\n"
    )
    facts = dataclasses.replace(ready_facts(), sigstore=issues(directory, [A, B]))
    assert found(facts) == [(f.SIGSTORE_ATTACHMENTS_OFF, A), (f.SIGSTORE_ATTACHMENTS_OFF, B)]


def test_an_invalid_directory_is_registries_d_invalid(tmp_path: Path) -> None:
    directory = tmp_path / "registries.d"
    directory.mkdir()
    (directory / "a.yaml").write_text("default-docker:\n  use-sigstore-attachments: true\n")
    (directory / "b.yaml").write_text("default-docker:\n  use-sigstore-attachments: true\n")
    facts = dataclasses.replace(ready_facts(), sigstore=issues(directory, []))
    assert found(facts) == [(f.REGISTRIES_D_INVALID, str(directory))]


def test_a_directory_that_is_a_file_is_registries_d_invalid(tmp_path: Path) -> None:
    directory = tmp_path / "registries.d"
    directory.write_text("not a directory")
    facts = dataclasses.replace(ready_facts(), sigstore=issues(directory, [A]))
    assert found(facts) == [(f.REGISTRIES_D_INVALID, str(directory))]


def test_an_unknown_issue_reason_is_never_dropped() -> None:
    issue = SigstoreIssue("Other", "x", "m", "r")
    facts = dataclasses.replace(ready_facts(), sigstore=(issue,))
    assert found(facts) == [(f.REGISTRIES_D_INVALID, "x")]


def test_signatures_required_only_for_images_whose_signatures_are_not_held() -> None:
    policy = SignaturePolicy("/etc/containers/policy.json", ("sigstoreSigned",))
    base = dataclasses.replace(ready_facts(), signature_policy=policy)
    assert found(dataclasses.replace(base, held_signatures=frozenset({A}))) == [
        (f.SIGNATURES_REQUIRED, B)
    ]
    assert found(dataclasses.replace(base, held_signatures=frozenset())) == [
        (f.SIGNATURES_REQUIRED, A),
        (f.SIGNATURES_REQUIRED, B),
    ]


def test_unknown_held_signatures_are_not_counted_as_none() -> None:
    policy = SignaturePolicy("/etc/containers/policy.json", ("sigstoreSigned",))
    facts = dataclasses.replace(ready_facts(), signature_policy=policy, held_signatures=None)
    assert found(facts) == []


def _descriptor(char: str, size: int) -> dict[str, object]:
    return {"mediaType": "x", "digest": "sha256:" + char * 64, "size": size}


def test_signature_manifest_blobs() -> None:
    doc = {"schemaVersion": 2, "config": _descriptor("1", 233), "layers": [_descriptor("2", 9)]}
    assert signature_manifest_blobs(json.dumps(doc).encode()) == {
        "sha256:" + "1" * 64: 233,
        "sha256:" + "2" * 64: 9,
    }
    bad: object
    for bad in (
        {"config": _descriptor("1", 2)},
        {"config": _descriptor("1", -1), "layers": []},
        {"config": {"digest": "sha256:zz", "size": 1}, "layers": []},
        {"config": _descriptor("1", True), "layers": []},
        [],
    ):
        assert signature_manifest_blobs(json.dumps(bad).encode()) is None
    assert signature_manifest_blobs(b'{"config": 1, "config": 2}') is None
