"""Sigstore (cosign-format) signatures of test images, made here and pushed to a test registry.

``SigningKey`` is an ECDSA P-256 key made with ``cryptography``; ``sign_image`` builds what a
registry holding sigstore signatures holds for an image (docs/runtime-facts.md, "Sigstore
signatures"): under the tag ``sha256-<hex>.sig`` of the image's repository, an OCI image
manifest whose one layer is the simple-signing payload naming the image's repository and
manifest digest, its ECDSA signature (SHA-256, DER, base64) in the layer's
``dev.cosignproject.cosign/signature`` annotation. The runtime checks it against the public
key a ``sigstoreSigned`` policy names.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from nodeagent.bundles.signatures import SIGNATURE_ANNOTATION, SIGNATURE_LAYER_TYPE, signature_tag
from tests.testenv.images import make_image_set, push
from tests.testenv.registry import Registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
PAYLOAD_TYPE = "cosign container image signature"


@dataclass
class SigningKey:
    """A fresh P-256 key; ``public_pem`` is what a policy's ``keyPath`` file holds."""

    private: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )

    @property
    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def write_public(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.public_pem)
        return path

    def sign(self, payload: bytes) -> str:
        return base64.b64encode(self.private.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()


def payload(repository: str, digest: str) -> bytes:
    """The simple-signing payload: ``repository`` is ``host[:port]/path`` (no tag)."""
    doc = {
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
        "size": len(data),
    }


def signature_manifest(key: SigningKey, repository: str, digest: str) -> tuple[bytes, list[bytes]]:
    """The signature manifest of ``repository@digest`` and its blobs (config, payload)."""
    body = payload(repository, digest)
    config = json.dumps({"architecture": "", "os": "", "rootfs": {"type": "layers",
                         "diff_ids": [_descriptor("", body)["digest"]]}}).encode()  # fmt: skip
    layer = _descriptor(SIGNATURE_LAYER_TYPE, body) | {
        "annotations": {SIGNATURE_ANNOTATION: key.sign(body)}
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": _descriptor(OCI_CONFIG, config),
        "layers": [layer],
    }
    return json.dumps(manifest).encode(), [config, body]


def _call(
    base: str, method: str, path: str, body: bytes = b"", kind: str = ""
) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(base).netloc, timeout=30)
    headers = {"Content-Length": str(len(body))} | ({"Content-Type": kind} if kind else {})
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def _push_blob(base: str, repository: str, data: bytes) -> None:
    status, headers = _call(base, "POST", f"/v2/{repository}/blobs/uploads/")
    assert status == 202, f"upload start: HTTP {status}"
    location = urllib.parse.urlsplit(urllib.parse.urljoin(base, headers["location"]))
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    query = f"{location.query}&" if location.query else ""
    target = f"{location.path}?{query}digest={urllib.parse.quote(digest)}"
    status, _ = _call(base, "PUT", target, data, "application/octet-stream")
    assert status == 201, f"blob upload: HTTP {status}"


def sign_image(registry_url: str, host: str, repository: str, digest: str, key: SigningKey) -> str:
    """Push the signature of ``host/repository@digest`` under its sigstore tag; its digest."""
    manifest, blobs = signature_manifest(key, f"{host}/{repository}", digest)
    base = registry_url.rstrip("/")
    for blob in blobs:
        _push_blob(base, repository, blob)
    tag = signature_tag(digest)
    status, _ = _call(base, "PUT", f"/v2/{repository}/manifests/{tag}", manifest, OCI_MANIFEST)
    assert status == 201, f"signature manifest: HTTP {status}"
    return f"sha256:{hashlib.sha256(manifest).hexdigest()}"


def push_signed_images(
    registry: Registry, key: SigningKey, *, count: int, layer_bytes: int, base_bytes: int, seed: int
) -> tuple[list[str], dict[str, str]]:
    """``count`` images pushed to ``registry`` and each signed with ``key``: their references
    by digest, and reference -> digest of its signature manifest."""
    images = make_image_set(
        count, layer_size_bytes=layer_bytes, shared_base_size_bytes=base_bytes, seed=seed
    )
    pushed = [push(registry.url, i.repository, i.build()) for i in images]
    refs = [p.reference(registry.host) for p in pushed]
    digests = {
        ref: sign_image(registry.url, registry.host, p.repository, p.digest, key)
        for ref, p in zip(refs, pushed, strict=True)
    }
    return refs, digests
