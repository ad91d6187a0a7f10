"""nodeagent's own image in a bundle: the self-update of the container variant (decision 0074).

A bundle may carry a newer nodeagent image as one of its ``images[]`` (its blobs stored and
served like every other image's) and, in ``bundle.json``'s ``agentImage`` (format 3), the
image's **statement** signed by an *agent image key*: the same statement and key set the
first-image loader checks on a stick (decision 0071; ``/etc/nodeagent/image-keys.d``), not
the bundle keys. The bundle's signature makes the field authentic as a part of the bundle;
only the statement's signature makes the image trusted to run as root: a bundle key alone
never switches the agent.

The statement (``nodeagent-image-statement-v2``, at most 4 KiB of ASCII lines, made by
``tools/build_image.py``)::

    nodeagent-image-statement-v2
    manifest-digest=sha256:<64 hex>
    sequence=<0..2^53-1, no leading zero>
    version=<1-64 of [A-Za-z0-9._+-]>
    [archive-sha256=<64 hex>]          a stick's archive only
    [archive=<name>.oci.tar]

``sequence`` orders images: a node never takes one lower than the newest it accepted, nor
another image under the same sequence (the host keeps ``<agent image dir>/sequence``).

Pure: ``agent_image_of`` reads the field, ``parse_statement`` the statement,
``verify_statement`` checks the signature against given keys, ``judge`` applies the order
and the node's rejected list. The adapter (``adapters.bundles.agent_image``) reads the keys
and the node's records and stages the image for the host's loader.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION
from nodeagent.errors import (
    BundleManifestInvalid,
    ImageDigestMismatch,
    ImageRollback,
    ImageSignatureInvalid,
    ImageStatementInvalid,
)
from nodeagent.references import PinnedImageRef
from nodeagent.strict import clip

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

AGENT_IMAGE_KEY: Final = "agentImage"
STATEMENT_HEADER: Final = "nodeagent-image-statement-v2"
MAX_STATEMENT_BYTES: Final = 4096
"""As the host's loader (systemd/container/nodeagent-image-load)."""
SIGNATURE_BYTES: Final = 64
"""A raw Ed25519 signature."""
MAX_SEQUENCE: Final = 2**53 - 1
_LINE: Final = re.compile(
    r"(?P<key>manifest-digest)=(?P<digest>sha256:[0-9a-f]{64})"
    r"|(?P<seq_key>sequence)=(?P<sequence>0|[1-9][0-9]{0,15})"
    r"|(?P<version_key>version)=(?P<version>[A-Za-z0-9._+-]{1,64})"
    r"|(?P<sum_key>archive-sha256)=[0-9a-f]{64}"
    r"|(?P<archive_key>archive)=[A-Za-z0-9._+-]{1,128}"
)
"""Every line a statement may hold after its header (the loader's ``line_re``)."""


@dataclass(frozen=True, slots=True)
class AgentImage:
    """``bundle.json``'s ``agentImage``: which of the bundle's images is nodeagent's, and its
    signed statement. Authentic as part of the bundle; trusted only once verified."""

    image: PinnedImageRef
    manifest_digest: str
    """The ``images[]`` entry's ``manifestDigest``."""
    statement: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class ImageStatement:
    manifest_digest: str
    sequence: int
    version: str


@dataclass(frozen=True, slots=True)
class NodeImages:
    """What the node's host side recorded (``<agent image dir>``): the newest accepted
    (sequence, digest), or None; the digests rolled back; the digest running now."""

    accepted: tuple[int, str] | None
    rejected: frozenset[str]
    running: str


def agent_image_of(
    doc: Mapping[str, Any], images: Iterable[tuple[PinnedImageRef, str]]
) -> AgentImage | None:
    """``agentImage``: ``{"image": <an images[] name>, "statement": <text>, "signature":
    <base64 of 64 bytes>}``, format 3. Its shape only; the statement is judged when the
    node acts on it (``parse_statement``, ``verify_statement``), so a bad one refuses the
    self-update, not the bundle's other images."""
    if AGENT_IMAGE_KEY not in doc:
        return None
    where = f"bundle.json {AGENT_IMAGE_KEY}"
    if doc.get("formatVersion") != FRESHNESS_FORMAT_VERSION:
        raise BundleManifestInvalid(f"{where} needs formatVersion {FRESHNESS_FORMAT_VERSION}")
    item = doc[AGENT_IMAGE_KEY]
    if not isinstance(item, dict) or set(item) != {"image", "statement", "signature"}:
        raise BundleManifestInvalid(f"{where} must be an object of image, statement, signature")
    name, statement, signature = item["image"], item["statement"], item["signature"]
    carried = {str(ref): (ref, digest) for ref, digest in images}
    if not isinstance(name, str) or name not in carried:
        raise BundleManifestInvalid(f"{where}: image must name one of images[]")
    if not isinstance(statement, str) or not 0 < len(statement) <= MAX_STATEMENT_BYTES:
        raise BundleManifestInvalid(f"{where}: statement must be 1-{MAX_STATEMENT_BYTES} chars")
    if not statement.isascii():
        raise BundleManifestInvalid(f"{where}: statement must be ASCII")
    raw = _signature(signature, where)
    ref, digest = carried[name]
    return AgentImage(ref, digest, statement.encode("ascii"), raw)


def agent_image_doc(
    statement: bytes, signature: bytes, images: Iterable[PinnedImageRef]
) -> dict[str, str]:
    """``agentImage`` for ``bundle create --agent-image-statement``: the image of ``images``
    the statement signs (by manifest digest), the statement, the signature in base64. The
    statement's form is checked here; its signature only on the node, against that node's
    agent image keys (the factory may hold none of the public keys)."""
    found = parse_statement(statement)
    if len(signature) != SIGNATURE_BYTES:
        raise ImageStatementInvalid(
            f"the statement's signature is {len(signature)} bytes, not {SIGNATURE_BYTES}"
        )
    named = [ref for ref in images if ref.digest == found.manifest_digest]
    if not named:
        raise ImageDigestMismatch(
            f"the statement signs {found.manifest_digest}, which no --image of the bundle is"
        )
    return {
        "image": str(named[0]),
        "statement": statement.decode("ascii"),
        "signature": base64.b64encode(signature).decode("ascii"),
    }


def _signature(value: object, where: str) -> bytes:
    if not isinstance(value, str) or len(value) > 128:
        raise BundleManifestInvalid(f"{where}: signature must be base64 of {SIGNATURE_BYTES} bytes")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BundleManifestInvalid(f"{where}: signature is not base64") from exc
    if len(raw) != SIGNATURE_BYTES:
        raise BundleManifestInvalid(f"{where}: signature must be {SIGNATURE_BYTES} bytes")
    return raw


def parse_statement(data: bytes) -> ImageStatement:
    """The statement's fields, or ``ImageStatementInvalid``: the header, then each line once
    of the known ones, manifest-digest, sequence and version required."""
    if len(data) > MAX_STATEMENT_BYTES or not data.isascii() or not data.endswith(b"\n"):
        raise ImageStatementInvalid(
            f"the statement is not at most {MAX_STATEMENT_BYTES} bytes of ASCII lines"
        )
    header, *lines = data.decode("ascii").removesuffix("\n").split("\n")
    if header != STATEMENT_HEADER:
        raise ImageStatementInvalid(f"the statement does not start with {STATEMENT_HEADER}")
    fields: dict[str, str] = {}
    for line in lines:
        found = _LINE.fullmatch(line)
        key = line.partition("=")[0]
        if found is None or key in fields:
            raise ImageStatementInvalid(f"statement line {clip(line, 80)!r} is unknown or repeated")
        fields[key] = line.partition("=")[2]
    missing = {"manifest-digest", "sequence", "version"} - set(fields)
    if missing:
        raise ImageStatementInvalid(f"the statement lacks {', '.join(sorted(missing))}")
    sequence = int(fields["sequence"])
    if sequence > MAX_SEQUENCE:
        raise ImageStatementInvalid(f"sequence {sequence} is over 2^53-1")
    return ImageStatement(fields["manifest-digest"], sequence, fields["version"])


def verify_statement(agent: AgentImage, keys: Mapping[str, Ed25519PublicKey], keys_dir: str) -> str:
    """The name of the agent image key whose signature the statement carries, or
    ``ImageSignatureInvalid``: a bundle key, any other key, no key at all."""
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 (only when used)

    for name, key in sorted(keys.items()):
        try:
            key.verify(agent.signature, agent.statement)
        except InvalidSignature:
            continue
        return name
    held = f"{len(keys)} agent image key(s)" if keys else "no agent image key"
    raise ImageSignatureInvalid(
        f"the statement of {agent.image} is signed by none of the {held} in {keys_dir}: "
        "a bundle key alone never runs new agent code"
    )


def judge(agent: AgentImage, statement: ImageStatement, node: NodeImages) -> bool:
    """True when the image is to be staged, False when it runs already; otherwise the
    reason it is refused (``ImageDigestMismatch``, ``ImageRollback``)."""
    if statement.manifest_digest != agent.manifest_digest:
        raise ImageDigestMismatch(
            f"the statement signs {statement.manifest_digest}, the bundle carries "
            f"{agent.image} as {agent.manifest_digest}"
        )
    if statement.manifest_digest == node.running:
        return False
    if statement.manifest_digest in node.rejected:
        raise ImageRollback(
            f"{statement.manifest_digest} was rolled back on this node before; a newer image "
            "is needed"
        )
    if node.accepted is not None:
        have_sequence, have_digest = node.accepted
        older = statement.sequence < have_sequence
        twin = statement.sequence == have_sequence and statement.manifest_digest != have_digest
        if older or twin:
            raise ImageRollback(
                f"sequence {statement.sequence} of {statement.manifest_digest}: this node "
                f"accepted sequence {have_sequence} ({have_digest})"
            )
    return True
