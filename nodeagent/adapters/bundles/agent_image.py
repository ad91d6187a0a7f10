"""The daemon's side of the container variant's self-update (decision 0074): a bundle in the
node's store that carries a newer nodeagent image (``agentImage``, ``bundles.agent_image``)
is checked here (the bundle's signature again, the statement's against the agent image keys,
the order against the host's records) and, when it is to run, staged for the host:
``<agent image dir>/incoming/<hex>/`` holding ``statement``, ``statement.sig`` (raw Ed25519)
and ``layout/``, the image as an OCI layout whose blobs are hard links to the store's (a copy
where the store is on another filesystem). The host's ``nodeagent-image-load --incoming``
(systemd/container/, started by ``nodeagent-image-update.path``) checks it all again, loads
it with podman into nodeagent's own storage, writes ``50-self-update.conf`` and restarts
nodeagent. Staging is atomic: a directory is renamed into ``incoming/`` once complete.

The daemon runs no podman and writes no unit: it has neither in its container, and the
checks that let new code run as root are made where the old code is not (the host).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from nodeagent.adapters.bundles.tree import load_trusted_keys_dir, read_signed_manifest
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.bundles.agent_image import (
    AgentImage,
    ImageStatement,
    NodeImages,
    judge,
    parse_statement,
    verify_statement,
)
from nodeagent.errors import ImageRollback, ImageStageFailed, StoreBlobMissing
from nodeagent.strict import clip

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

REPOSITORY: Final = "localhost/nodeagent"
"""What the units run: ``localhost/nodeagent@<digest>`` (decision 0070)."""
RUNNING_ENV: Final = "NODEAGENT_IMAGE"
"""The image the unit runs, passed into the container (``--env NODEAGENT_IMAGE``)."""
MAX_KEYS: Final = 64
MAX_KEY_BYTES: Final = 16 * 1024
MAX_RECORD_BYTES: Final = 64 * 1024
MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
IMAGE_MANIFEST_TYPES: Final = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
_RECORD: Final = re.compile(r"(0|[1-9][0-9]{0,15}) (sha256:[0-9a-f]{64})\n?")


def running_digest(environ: Mapping[str, str]) -> str | None:
    """The digest of the image this daemon runs from (the container variant), or None (the
    RPM, or a reference of another form: no self-update then)."""
    text = environ.get(RUNNING_ENV, "")
    name, _, digest = text.partition("@")
    return digest if name == REPOSITORY and _DIGEST.fullmatch(digest) else None


def self_digests(environ: Mapping[str, str]) -> frozenset[str]:
    """The digests the set ``nodeagent-self`` keeps in the store: the image running now."""
    running = running_digest(environ)
    return frozenset() if running is None else frozenset({running})


def load_image_keys(directory: Path) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 public keys (``*.pem``) of ``directory``, by file name; a file that is no
    such key is skipped (it can sign nothing). None when the directory is missing."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        load_pem_public_key,
    )

    try:
        paths = sorted(p for p in directory.iterdir() if p.name.endswith(".pem"))[:MAX_KEYS]
    except FileNotFoundError:
        return {}
    keys: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        try:
            with path.open("rb") as stream:
                data = stream.read(MAX_KEY_BYTES + 1)
            key = load_pem_public_key(data) if len(data) <= MAX_KEY_BYTES else None
        except (OSError, ValueError):
            continue
        if isinstance(key, Ed25519PublicKey):
            keys[path.name] = key
    return keys


def read_node_images(image_dir: Path, running: str) -> NodeImages:
    """The host's records: ``sequence`` ("SEQUENCE DIGEST") and ``rejected`` (a digest a
    line). A damaged ``sequence`` cannot order anything: ``ImageRollback``, never a guess."""
    accepted = None
    text = _read_small(image_dir / "sequence")
    if text is not None:
        found = _RECORD.fullmatch(text)
        if found is None:
            raise ImageRollback(
                f"{image_dir / 'sequence'} is damaged ({clip(text, 80)!r}): no image can be "
                "ordered against it; check it, remove it to accept any signed image"
            )
        accepted = (int(found.group(1)), found.group(2))
    rejected_text = _read_small(image_dir / "rejected") or ""
    rejected = frozenset(ln for ln in rejected_text.splitlines() if _DIGEST.fullmatch(ln))
    return NodeImages(accepted, rejected, running)


def _read_small(path: Path) -> str | None:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ImageStageFailed(f"cannot read {path}: {exc.strerror}") from exc
    return data.decode("ascii", errors="replace")


class AgentImageStager:
    """Checks a stored bundle's ``agentImage`` and stages it for the host's loader."""

    def __init__(
        self,
        store_dir: Path,
        trusted_keys_dir: Path,
        image_keys_dir: Path,
        image_dir: Path,
        *,
        fips_switch: Path = FIPS_ENABLED_FILE,
    ) -> None:
        self.store_dir, self.trusted_keys_dir = store_dir, trusted_keys_dir
        self.fips_switch = fips_switch
        self.image_keys_dir, self.image_dir = image_keys_dir, image_dir

    def agent_image(self, bundle_id: str) -> AgentImage | None:
        """The stored bundle's ``agentImage``, its signature checked again."""
        root = self.store_dir / "bundles" / bundle_id
        keys = load_trusted_keys_dir(self.trusted_keys_dir, fips_switch=self.fips_switch)
        manifest, _ = read_signed_manifest(root, keys)
        return manifest.agent_image

    def check(self, agent: AgentImage, running: str) -> tuple[ImageStatement, str] | None:
        """(the statement, the key that signed it) when the image is to be staged; None when
        it runs already; the reason otherwise (``AgentImageRefused``)."""
        statement = parse_statement(agent.statement)
        keys = load_image_keys(self.image_keys_dir)
        key = verify_statement(agent, keys, str(self.image_keys_dir))
        if not judge(agent, statement, read_node_images(self.image_dir, running)):
            return None
        return statement, key

    def stage(self, agent: AgentImage, statement: ImageStatement) -> Path:
        """The image's layout, statement and signature in ``incoming/``; its path there."""
        hex_digest = agent.manifest_digest.removeprefix("sha256:")
        work = self.image_dir / "staging" / hex_digest
        target = self.image_dir / "incoming" / hex_digest
        try:
            shutil.rmtree(work, ignore_errors=True)
            (work / "layout" / "blobs" / "sha256").mkdir(parents=True, mode=0o700)
            media_type, size = self._link_image(agent.manifest_digest, work / "layout")
            index = {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": media_type,
                        "digest": agent.manifest_digest,
                        "size": size,
                        "annotations": {
                            "org.opencontainers.image.ref.name": (
                                f"{REPOSITORY}:{statement.version}"
                            )
                        },
                    }
                ],
            }
            (work / "layout" / "index.json").write_text(json.dumps(index, sort_keys=True))
            (work / "layout" / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
            (work / "statement").write_bytes(agent.statement)
            (work / "statement.sig").write_bytes(agent.signature)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
        except OSError as exc:
            shutil.rmtree(work, ignore_errors=True)
            raise ImageStageFailed(
                f"cannot stage {agent.manifest_digest} in {self.image_dir}: {exc.strerror}"
            ) from exc
        return target

    def _link_image(self, digest: str, layout: Path) -> tuple[str, int]:
        """The manifest, its config and layers into ``layout``; the manifest's type and size."""
        raw = self._blob(digest, layout).read_bytes()
        try:
            doc = json.loads(raw) if len(raw) <= MAX_MANIFEST_BYTES else None
        except ValueError:
            doc = None
        media_type = doc.get("mediaType") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or media_type not in IMAGE_MANIFEST_TYPES:
            raise ImageStageFailed(
                f"{digest} is not an image manifest of one platform ({clip(str(media_type), 80)})"
            )
        parts = [doc.get("config"), *(doc.get("layers") or [])]
        for part in parts:
            child = part.get("digest") if isinstance(part, dict) else None
            if not isinstance(child, str) or not _DIGEST.fullmatch(child):
                raise ImageStageFailed(f"{digest} names a blob that is no sha256 digest")
            self._blob(child, layout)
        return str(media_type), len(raw)

    def _blob(self, digest: str, layout: Path) -> Path:
        """The store's blob ``digest`` linked (or copied) into ``layout``."""
        hex_digest = digest.removeprefix("sha256:")
        source = self.store_dir / "blobs" / "sha256" / hex_digest
        target = layout / "blobs" / "sha256" / hex_digest
        if target.exists():
            return target
        try:
            os.link(source, target)
        except FileNotFoundError as exc:
            raise StoreBlobMissing(f"the store lacks {digest} of nodeagent's image") from exc
        except OSError:
            shutil.copyfile(source, target)  # another filesystem: a copy
        return target
