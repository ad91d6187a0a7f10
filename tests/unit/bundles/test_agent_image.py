"""nodeagent.bundles.agent_image: ``agentImage`` of bundle.json, the image statement, its
signature against the agent image keys, and the order a node takes images in."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodeagent.bundles.agent_image import (
    MAX_STATEMENT_BYTES,
    AgentImage,
    NodeImages,
    agent_image_doc,
    agent_image_of,
    judge,
    parse_statement,
    verify_statement,
)
from nodeagent.errors import (
    BundleManifestInvalid,
    ImageDigestMismatch,
    ImageRollback,
    ImageSignatureInvalid,
    ImageStatementInvalid,
)
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref

A, B, C = ("sha256:" + c * 64 for c in "abc")
REF = parse_pinned_image_ref(f"registry.example/nodeagent@{A}")
OTHER = parse_pinned_image_ref(f"registry.example/app@{B}")


def statement(digest: str = A, sequence: str = "2000", *extra: str) -> bytes:
    lines = ["nodeagent-image-statement-v2", f"manifest-digest={digest}", f"sequence={sequence}"]
    return ("\n".join([*lines, "version=1.2.3", *extra]) + "\n").encode()


def agent(text: bytes = statement(), key: Ed25519PrivateKey | None = None) -> AgentImage:
    signature = (key or Ed25519PrivateKey.generate()).sign(text)
    return AgentImage(REF, A, text, signature)


def doc(**agent_image: Any) -> dict[str, Any]:
    item = {
        "image": str(REF),
        "statement": statement().decode(),
        "signature": base64.b64encode(b"s" * 64).decode(),
    } | agent_image
    return {"formatVersion": 3, "agentImage": item}


def images() -> list[tuple[PinnedImageRef, str]]:
    return [(REF, A), (OTHER, B)]


# ---------------------------------------------------------------- the field
def test_no_field_no_agent_image() -> None:
    assert agent_image_of({"formatVersion": 3}, images()) is None


def test_the_field_names_a_carried_image_with_its_statement() -> None:
    found = agent_image_of(doc(), images())
    assert found is not None
    assert found.image == REF and found.manifest_digest == A
    assert found.signature == b"s" * 64


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"image": "registry.example/nodeagent@" + C}, "one of images"),
        ({"image": 7}, "one of images"),
        ({"signature": "not base64!"}, "base64"),
        ({"signature": base64.b64encode(b"s" * 63).decode()}, "64 bytes"),
        ({"statement": ""}, "statement"),
        ({"statement": "x" * (MAX_STATEMENT_BYTES + 1)}, "statement"),
        ({"statement": "nodeagent-image-statement-v2\né\n"}, "ASCII"),
        ({"extra": "field"}, "an object of"),
    ],
)
def test_a_malformed_field_refuses_the_bundle(change: dict[str, Any], words: str) -> None:
    with pytest.raises(BundleManifestInvalid, match=words):
        agent_image_of(doc(**change), images())


def test_the_field_needs_format_3() -> None:
    with pytest.raises(BundleManifestInvalid, match="formatVersion 3"):
        agent_image_of(doc() | {"formatVersion": 2}, images())


# ---------------------------------------------------------------- the statement
def test_a_statement_parses() -> None:
    found = parse_statement(statement(A, "2000", "archive-sha256=" + "f" * 64, "archive=x.oci.tar"))
    assert (found.manifest_digest, found.sequence, found.version) == (A, 2000, "1.2.3")


@pytest.mark.parametrize(
    "text",
    [
        statement().replace(b"-v2", b"-v1"),
        statement(sequence="010"),  # one spelling of a number
        statement(sequence="9007199254740992"),  # 2^53
        statement(A, "1", "sequence=2"),  # repeated
        statement(A, "1", "origin=factory"),  # unknown
        statement().replace(b"sequence=2000\n", b""),
        statement().rstrip(b"\n"),
        statement().replace(b"\n", b"\r\n"),
        b"x" * (MAX_STATEMENT_BYTES + 1),
    ],
)
def test_a_statement_out_of_form_is_refused(text: bytes) -> None:
    with pytest.raises(ImageStatementInvalid):
        parse_statement(text)


# ---------------------------------------------------------------- the signature
def test_an_agent_image_key_signs_it() -> None:
    key = Ed25519PrivateKey.generate()
    keys = {"other.pem": Ed25519PrivateKey.generate().public_key(), "agent.pem": key.public_key()}
    assert verify_statement(agent(key=key), keys, "/keys") == "agent.pem"


def test_any_other_key_is_refused() -> None:
    keys = {"agent.pem": Ed25519PrivateKey.generate().public_key()}
    with pytest.raises(ImageSignatureInvalid, match="a bundle key alone"):
        verify_statement(agent(), keys, "/keys")
    with pytest.raises(ImageSignatureInvalid, match="no agent image key"):
        verify_statement(agent(), {}, "/keys")


def test_an_edited_statement_fails_the_signature() -> None:
    key = Ed25519PrivateKey.generate()
    signed = agent(key=key)
    edited = AgentImage(REF, A, statement(sequence="9000"), signed.signature)
    with pytest.raises(ImageSignatureInvalid):
        verify_statement(edited, {"agent.pem": key.public_key()}, "/keys")


# ---------------------------------------------------------------- the order
def node(
    accepted: tuple[int, str] | None = (1000, C), rejected: set[str] | None = None
) -> NodeImages:
    return NodeImages(accepted, frozenset(rejected or ()), running=C)


def test_a_newer_image_is_staged() -> None:
    assert judge(agent(), parse_statement(statement()), node()) is True
    assert judge(agent(), parse_statement(statement()), node(None)) is True


def test_the_running_image_is_not_staged_again() -> None:
    running = NodeImages((2000, A), frozenset(), running=A)
    assert judge(agent(), parse_statement(statement()), running) is False


def test_a_statement_of_another_image_is_refused() -> None:
    with pytest.raises(ImageDigestMismatch):
        judge(agent(statement(B)), parse_statement(statement(B)), node())


@pytest.mark.parametrize(
    "state",
    [node((2001, C)), node((2000, C)), node((1000, C), {A})],
    ids=["older", "same-sequence-other-image", "rolled-back-before"],
)
def test_rollbacks_are_refused(state: NodeImages) -> None:
    with pytest.raises(ImageRollback):
        judge(agent(), parse_statement(statement()), state)


def test_the_same_image_under_its_own_sequence_is_taken_again() -> None:
    """Accepted once, not running now (a new MachineConfig digest made it step aside)."""
    assert judge(agent(), parse_statement(statement()), node((2000, A))) is True


# ---------------------------------------------------------------- bundle create
def test_bundle_create_carries_the_image_the_statement_names() -> None:
    made = agent_image_doc(statement(), b"s" * 64, [OTHER, REF])
    assert made["image"] == str(REF)
    assert agent_image_of({"formatVersion": 3, "agentImage": made}, images()) is not None


def test_bundle_create_refuses_a_statement_of_no_carried_image() -> None:
    with pytest.raises(ImageDigestMismatch):
        agent_image_doc(statement(C), b"s" * 64, [OTHER, REF])
    with pytest.raises(ImageStatementInvalid):
        agent_image_doc(statement(), b"s" * 12, [REF])
