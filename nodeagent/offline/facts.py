"""What the drill's checks read, as plain values gathered by ``FactSource`` (pure).

A fact the gatherer could not learn is ``None`` and a finding in ``problems`` says why
(``OfflineCheckIncomplete``): the checks that need it skip it, so nothing unknown is ever
counted as fine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.offline.findings import Finding, PodRef
from nodeagent.ports import RunningContainer, StoredImage

__all__ = [
    "Facts",
    "FactSource",
    "KubeletImagePolicy",
    "PinnedSet",
    "PodImage",
    "RunningContainer",
    "SignaturePolicy",
    "SigstoreIssue",
]


@dataclass(frozen=True, slots=True)
class PinnedSet:
    """A PinnedImageSet the node is asked to hold (its spec file), by digest references."""

    name: str
    images: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodImage:
    """One container of a pod on this node: its image and its pull policy."""

    pod: PodRef
    container: str
    image: str
    pull_policy: str
    """``Always``, ``IfNotPresent`` or ``Never``, after Kubernetes' defaulting."""
    source: str
    """``api`` or the static pod manifest's path."""


@dataclass(frozen=True, slots=True)
class KubeletImagePolicy:
    """The kubelet configuration's KEP-2535 settings (docs/runtime-facts.md)."""

    source: str
    policy: str | None
    """``imagePullCredentialsVerificationPolicy``; None: unset (the kubelet's default)."""
    allowlist: tuple[str, ...] = ()
    """``preloadedImagesVerificationAllowlist``."""
    is_gate_on: bool | None = None
    """``featureGates.KubeletEnsureSecretPulledImages``; None: not set in the file."""


@dataclass(frozen=True, slots=True)
class SignaturePolicy:
    """containers-policy.json(5) as far as the drill reads it: requirement types by scope."""

    source: str
    default: tuple[str, ...]
    """The types of the top-level ``default`` requirements."""
    docker_scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """``transports.docker``: scope -> requirement types (``""`` is the transport default)."""


@dataclass(frozen=True, slots=True)
class SigstoreIssue:
    """What keeps CRI-O from reading a sigstore signature a bundle carried for a pinned image
    (``bundles.signatures.sigstore_findings``, over ``[runtime] registries_d_dir``)."""

    reason: str
    """``SigstoreAttachmentsOff`` or ``RegistriesDInvalid``."""
    subject: str
    message: str
    remedy: str


@dataclass(frozen=True, slots=True)
class NodeMirrorDropin:
    """The node mirror's registries.conf drop-in as found, and what it should mirror."""

    path: str
    listen: str
    """``[mirror] listen``: the mirrors' host."""
    repositories: frozenset[str]
    """``host/repo`` (as containers-image normalizes it) of every image the store holds."""
    text: str | None
    """The drop-in's text; None when it does not exist."""


@dataclass(frozen=True, slots=True)
class Facts:
    sets: tuple[PinnedSet, ...] | None = None
    images: tuple[StoredImage, ...] | None = None
    containers: tuple[RunningContainer, ...] | None = None
    pause_image: str | None = None
    pause_source: str = ""
    pods: tuple[PodImage, ...] | None = None
    pods_source: str = ""
    kubelet: KubeletImagePolicy | None = None
    signature_policy: SignaturePolicy | None = None
    held_signatures: frozenset[str] | None = frozenset()
    """Pinned images whose signatures the node holds: a stored bundle's signed manifest lists
    them (``imageSignatures``) and the store holds every blob of the signature. None: the
    store could not be read (a finding says so)."""
    sigstore: tuple[SigstoreIssue, ...] | None = None
    """Why CRI-O would not read carried signatures of pinned images (None: not learned)."""
    store_restorable: frozenset[str] | None = None
    """Pinned images every blob of which the node's store holds."""
    stored_digests: frozenset[str] | None = None
    """Manifest digests of the images whose top manifest the store holds (the node mirror
    serves them). None: not learned (the store could not be read: a finding says so)."""
    mirror_dropin: NodeMirrorDropin | None = None
    """None: the node mirror is off (nothing to check)."""
    problems: tuple[Finding, ...] = ()


class FactSource(Protocol):
    """Gathers the facts (``adapters.offline.HostFacts``)."""

    async def gather(self) -> Facts: ...
