"""The importer's ports: what ``bundles.importer.Importer`` is given by the daemon's wiring
(``nodeagent.daemon.bundles``) or by a test: the bundle's verification, the runtime, the
loopback server and mirror, the node's image store, the spec directories and the node's
labels. Nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nodeagent.bundles.freshness import Stamp
from nodeagent.bundles.manifest import BundleManifest, ExpectedFile
from nodeagent.bundles.serving import BundleServerPort, MirrorPort
from nodeagent.bundles.serving import SigstorePort as SigstorePort
from nodeagent.ports import ImageRuntime, Reloader, SpaceProbe, StateStore
from nodeagent.prepull import PrePuller
from nodeagent.progress import ByteProgress
from nodeagent.registries import Platform
from nodeagent.status import BundleReport


class VerifiedBundle(Protocol):
    @property
    def manifest(self) -> BundleManifest: ...

    @property
    def signed_by(self) -> str: ...

    @property
    def key_id_hex(self) -> str: ...

    @property
    def manifest_digest(self) -> str:
        """``sha256:<hex>`` of the ``bundle.json`` verified."""
        ...

    @property
    def linked(self) -> tuple[str, ...]:
        """The other key that signed it (a bundle signed with minisign and ECDSA)."""
        ...


class ImageStorePort(Protocol):
    """The node's image store (``adapters.store.node_store.NodeImageStore``); blocking calls
    run in a worker thread."""

    @property
    def root(self) -> Path: ...

    def missing_bytes(self, manifest: BundleManifest) -> int: ...

    def shares_filesystem(self, path: str) -> bool: ...

    def copy(
        self,
        medium: Path,
        manifest: BundleManifest,
        on_progress: Callable[[ByteProgress], None],
        should_stop: Callable[[], bool] = ...,
        *,
        on_admitted: Callable[[], None] = ...,
        on_stored: Callable[[str], None] = ...,
    ) -> object:
        """Blocking (run in a thread); stops at its next chunk once ``should_stop``;
        ``on_admitted`` once the copy passed its checks, before the first blob;
        ``on_stored`` with each blob's digest once it is stored."""

    def served_files(self, manifest: BundleManifest) -> dict[str, ExpectedFile]: ...

    def has_blob(self, digest: str) -> bool: ...

    def read_manifest(self, digest: str) -> bytes | None:
        """A stored blob's bytes if it is small enough to be a manifest, else None."""
        ...

    def discard(self, digests: Iterable[str]) -> tuple[int, int]:
        """Remove those of ``digests`` no stored bundle lists: (blobs, bytes) removed."""
        ...


SignedServerFactory = Callable[
    [Path, Mapping[str, ExpectedFile], Mapping[str, str]], BundleServerPort
]
"""A loopback server that also answers signature tags (``signatures.served_tags``)."""


class SpecSink(Protocol):
    """Writes a bundle's PinnedImageSet into the persistent or transient spec directory."""

    def write_set(self, file_name: str, text: str, *, is_persistent: bool) -> Path: ...


@dataclass
class ImporterPorts:
    verify: Callable[[Path], VerifiedBundle]
    runtime: ImageRuntime
    make_server: Callable[[Path, Mapping[str, ExpectedFile]], BundleServerPort]
    mirror: MirrorPort
    reloader: Reloader
    make_puller: Callable[[], PrePuller]
    space: SpaceProbe
    specs: SpecSink
    store: StateStore
    is_present_on_media: Callable[[Path], bool] = lambda root: root.exists()
    on_report: Callable[[BundleReport], None] = field(default=lambda _r: None)
    image_store: ImageStorePort | None = None
    """With a store, the bundle is copied into it first and imported from there."""
    is_probing_mirror: bool = False
    """``serving.MirrorPullPorts.is_probing``: no image pulled before the runtime is seen to
    follow the mirror (the daemon's wiring: True)."""
    release_medium: Callable[[Path], None] = field(default=lambda _root: None)
    """Told once the bundle is in the store, before the status says the medium may be
    removed: from then on the import no longer reads the medium, so its removal must not
    stop it."""
    node_labels: Callable[[], Mapping[str, str] | None] = field(default=lambda: None)
    """The node's labels as the Kubernetes API last gave them; None when they are not known
    (no cluster mode, or not listed yet): a bundle with a target selector is then refused."""
    wait_node_labels: Callable[[], Awaitable[Mapping[str, str] | None]] | None = None
    """Cluster mode: the labels once the API has listed the Node, waited for (bounded) when a
    bundle with a selector comes before them; unknown is not "no" (None: nothing to wait for)."""
    make_signed_server: SignedServerFactory | None = None
    """For a bundle with ``imageSignatures``: a server that also answers its signature tags
    (``signatures.served_tags``); None: such bundles are served without them."""
    cluster_version: Callable[[], str | None] = field(default=lambda: None)
    space_note: Callable[[], str] = field(default=lambda: "")
    """Cluster mode: what holds the disk that retirement frees later (the release bundles kept
    pinned, ``cluster.retirement.space_note``), added to a release bundle refused for space."""
    """The cluster's current version (ClusterVersion's newest Completed release); None when
    not known (no cluster mode, not OpenShift, not listed yet): a release bundle is then
    imported without the upgrade-path check."""
    sigstore: SigstorePort | None = None
    platform: Platform | None = None
    """The node's platform: an import waits for the blobs of an index's entry for it alone
    (``bundles.arrivals``); None: for every entry."""
    """registries.d: checked for a bundle's signed images, and the loopback mirror's drop-in."""
    is_ignoring_target: bool = False
    """``bundle import --ignore-target``: a technician imports a bundle whose target's
    selector leaves this node out (its architecture is still checked, rule R13)."""
    accepted: Callable[[], Sequence[Stamp]] = field(default=lambda: ())
    """The signed manifests the node's store keeps, verified again (blocking, run in a
    thread; ``adapters.store.accepted``): the anti-rollback rule's high-water marks."""
    wall_clock: Callable[[], float] = time.time
    """Unix time, for a bundle's ``expires``."""
    is_allowing_rollback: bool = False
    """``bundle import --allow-rollback``: a technician takes a bundle older than one the
    node accepted (logged, ``bundle_rollback_allowed``). The daemon never sets it."""
    is_allowing_expired: bool = False
    """``bundle import --allow-expired``: likewise for an expired bundle."""
