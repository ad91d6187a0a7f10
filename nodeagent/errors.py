"""The error tree of nodeagent.

Every error a user or the node can cause has its own class and a stable
``reason`` code. The code is what ends up in the status object, in the journal
(field ``NODEAGENT_REASON``) and in the CLI's output; the message says what
happened and what to do about it. Retry decisions follow the two branches::

    NodeAgentError                      reason
    ├── TransientError(retry_after_s)   (retry later; the cause may go away)
    │   ├── RuntimeUnreachable          RuntimeUnreachable
    │   ├── RuntimeTimeout              RuntimeTimeout
    │   ├── RegistryUnavailable         RegistryUnavailable
    │   │   └── RegistryError           RegistryError (the registry answered 5xx)
    │   ├── SizeUnknown                 SizeUnknown
    │   ├── PullStalled                 PullStalled
    │   ├── RuntimeReloadFailed         RuntimeReloadFailed
    │   ├── MediaUnmountFailed          MediaUnmountFailed
    │   ├── MediaWatchFailed            MediaWatchFailed
    │   ├── ApiUnreachable              ApiUnreachable
    │   ├── NodeNotReady                NodeNotReady (registry pulls wait for Ready)
    │   │   └── NodeDiskPressure        NodeDiskPressure
    │   ├── PeerAnswerInvalid           PeerAnswerInvalid (a peer's document is malformed)
    │   ├── PeerUnreachable             PeerUnreachable (a peer failed, stalled or refused TLS)
    │   ├── PeerBusy                    PeerBusy (a peer answered 429/503: ask it later)
    │   ├── MetricsListenFailed         MetricsListenFailed ([metrics] listen cannot be bound)
    │   └── BundleFetchFailed           NoPeerLeft (every peer was dropped; tried again later)
    └── PermanentError                  (retrying the same thing will not help)
        ├── ImageNotFound               ImageNotFound
        ├── RegistryAuthFailed          RegistryAuthFailed
        ├── NoSpaceLeft                 NoSpaceLeft
        ├── RuntimeCallFailed           RuntimeCallFailed
        ├── RuntimeDoesNotPin           RuntimeDoesNotPin
        ├── PinsOverridden              PinsOverridden
        ├── RuntimeConfigInvalid        RuntimeConfigInvalid (another component's CRI-O file)
        ├── InsufficientDiskSpace       InsufficientDiskSpace
        ├── ConfigInvalid               ConfigInvalid
        ├── AuthFileInvalid             AuthFileInvalid
        ├── SpecInvalid                 SpecInvalid
        │   └── ImageReferenceInvalid   ImageReferenceInvalid
        ├── HostFileError               HostFileError
        │   └── StateFileDamaged        StateFileDamaged
        ├── SignatureMissing            BundleUnsigned
        ├── SignatureMalformed          BundleSignatureMalformed
        │   └── SignatureLegacy         BundleSignatureLegacy
        ├── UnknownSigningKey           BundleSignedByUnknownKey
        ├── SignatureInvalid            BundleSignatureInvalid
        ├── KeyMalformed                SigningKeyMalformed
        ├── ReleaseImageInvalid         ReleaseImageInvalid (bundle create --release input)
        ├── SecretKeyLocked             SigningKeyLocked
        ├── MediaMountFailed            MediaMountFailed
        ├── KubeconfigInvalid           KubeconfigInvalid
        ├── ApiAccessDenied             ApiAccessDenied
        ├── ApiRequestRejected          ApiRequestRejected
        ├── PoolMembershipInvalid       PoolMembershipInvalid (more than one custom pool)
        ├── PeerHoldingsInvalid         PeerHoldingsInvalid (a peer's published holdings)
        ├── StoreError                  (the node's image store, docs/store.md)
        │   ├── StoreFull               StoreFull (the [store] size cap)
        │   ├── StoreBlobCorrupt        StoreBlobCorrupt (a stored blob fails its digest)
        │   ├── StoreBlobMissing        StoreBlobMissing
        │   ├── StoreSourceMismatch     StoreSourceMismatch (bytes offered for a digest are not it)
        │   └── StoreRecordDamaged      StoreRecordDamaged
        └── BundleError                 (a bundle nodeagent refuses)
            ├── BundleFormatUnsupported BundleFormatUnsupported
            ├── BundleManifestInvalid   BundleManifestInvalid
            ├── BundleSetInvalid        BundleSetInvalid
            ├── BundleArchitectureMismatch BundleArchitectureMismatch
            ├── BundleNotInTarget       BundleNotInTarget (the target leaves the node out)
            ├── BundleReleaseInvalid    BundleReleaseInvalid (bundle.json's release object)
            ├── BundleRollback          BundleRollback (older than a bundle already accepted)
            ├── BundleExpired           BundleExpired (its signed expiry time is past)
            ├── BundleUnsafePath        BundleUnsafePath
            ├── BundleUnsafeEntry       BundleUnsafeEntry
            ├── BundleUnlistedFile      BundleUnlistedFile
            ├── BundleIncomplete        BundleIncomplete
            ├── BundleSizeMismatch      BundleSizeMismatch
            └── BundleDigestMismatch    BundleDigestMismatch
    NodeAgentError
    └── BundleMediaRemoved              BundleMediaRemoved (import interrupted; resumes)

The CLI exits with ``exit_code`` (sysexits.h values where one fits), so a
script can tell "try again later" (75, 69) from "fix the input" (78, 1).

Adapters wrap third-party exceptions into this tree with ``raise ... from``,
so the original cause stays visible in tracebacks while the rest of the code
only ever deals with these types.
"""

from __future__ import annotations

from typing import ClassVar


class NodeAgentError(Exception):
    """Base of every error nodeagent raises on purpose."""

    reason: ClassVar[str] = "Unknown"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class TransientError(NodeAgentError):
    """The operation may succeed if tried again after ``retry_after_s`` seconds."""

    reason = "Transient"
    exit_code = 75  # EX_TEMPFAIL
    default_retry_after_s: ClassVar[float] = 1.0

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s


class PermanentError(NodeAgentError):
    """Trying the same operation again will fail the same way until something changes."""

    reason = "Permanent"


class RuntimeUnreachable(TransientError):
    """The container runtime's CRI socket does not answer (runtime stopped or restarting)."""

    reason = "RuntimeUnreachable"
    exit_code = 69  # EX_UNAVAILABLE
    default_retry_after_s = 2.0


class RuntimeTimeout(TransientError):
    """A CRI call did not finish within its deadline."""

    reason = "RuntimeTimeout"


class RegistryUnavailable(TransientError):
    """The registry could not be reached or answered with a server error."""

    reason = "RegistryUnavailable"
    default_retry_after_s = 5.0


class RegistryError(RegistryUnavailable):
    """The registry answered with a server error (HTTP 5xx): it is up but failing."""

    reason = "RegistryError"


class SizeUnknown(TransientError):
    """An image's size could not be learned (no manifest from the registry, none cached).

    Disk admission never counts an unknown size as zero: the image's set is held, not
    pulled, until its size is known again.
    """

    reason = "SizeUnknown"
    default_retry_after_s = 5.0


class ImageNotFound(PermanentError):
    """The registry (or the runtime's store) has no image by that reference."""

    reason = "ImageNotFound"


class RegistryAuthFailed(PermanentError):
    """The registry refused the credentials, or asked for credentials we do not have."""

    reason = "RegistryAuthFailed"


class NoSpaceLeft(PermanentError):
    """The runtime's image filesystem is full (ENOSPC)."""

    reason = "NoSpaceLeft"


class RuntimeCallFailed(PermanentError):
    """The runtime rejected a request for a reason nodeagent does not classify further."""

    reason = "RuntimeCallFailed"


class ConfigInvalid(PermanentError):
    """nodeagent's own configuration is wrong; the message names the key and the file."""

    reason = "ConfigInvalid"
    exit_code = 78  # EX_CONFIG


class PullStalled(TransientError):
    """A pull made no progress (no bytes written to the image filesystem) for too long."""

    reason = "PullStalled"
    default_retry_after_s = 5.0


class RuntimeReloadFailed(TransientError):
    """The runtime could not be told to reload its configuration, or the reload failed."""

    reason = "RuntimeReloadFailed"
    default_retry_after_s = 5.0


class RuntimeDoesNotPin(PermanentError):
    """The runtime ignores ``pinned_images`` (CRI-O older than 1.28, or unpinning before 1.29.7)."""

    reason = "RuntimeDoesNotPin"


class PinsOverridden(PermanentError):
    """Another drop-in sorts after nodeagent's and replaces its ``pinned_images`` list."""

    reason = "PinsOverridden"


class RuntimeConfigInvalid(PermanentError):
    """Another component's CRI-O config file cannot be loaded (not TOML, too big, a wrong type).

    CRI-O refuses to start or reload with it too. nodeagent names the file, keeps rendering
    its own pins and carries that file's pins from its last good read (docs/pins.md).
    """

    reason = "RuntimeConfigInvalid"
    exit_code = 78  # EX_CONFIG


class InsufficientDiskSpace(PermanentError):
    """Disk admission refused: the images would not fit while keeping the reserve free."""

    reason = "InsufficientDiskSpace"
    exit_code = 73  # EX_CANTCREAT


class AuthFileInvalid(PermanentError):
    """The registry auth file (docker config JSON) cannot be read or parsed."""

    reason = "AuthFileInvalid"
    exit_code = 78  # EX_CONFIG


class SpecInvalid(PermanentError):
    """A PinnedImageSet document is malformed; the message names file, object and entry."""

    reason = "SpecInvalid"
    exit_code = 65  # EX_DATAERR


class ImageReferenceInvalid(SpecInvalid):
    """An image name is not a digest reference of the form the OpenShift API accepts."""

    reason = "ImageReferenceInvalid"


class HostFileError(PermanentError):
    """A file on the host (drop-in, state, link) could not be read or written."""

    reason = "HostFileError"
    exit_code = 74  # EX_IOERR


class StateFileDamaged(HostFileError):
    """A state file of nodeagent (ledger, status, manifest cache) cannot be decoded.

    nodeagent moves it aside (``<file>.damaged-<UTC time>``, kept for the report) and
    rebuilds the state from the spec files, the runtime and its last good copies.
    """

    reason = "StateFileDamaged"


class SignatureMissing(PermanentError):
    """There is no signature, or it is empty."""

    reason = "BundleUnsigned"
    exit_code = 65  # EX_DATAERR


class SignatureMalformed(PermanentError):
    """The signature text is not a minisign signature this module accepts."""

    reason = "BundleSignatureMalformed"
    exit_code = 65  # EX_DATAERR


class SignatureLegacy(SignatureMalformed):
    """A legacy (non-prehashed, "Ed") signature where only prehashed ("ED") ones are accepted."""

    reason = "BundleSignatureLegacy"


class UnknownSigningKey(PermanentError):
    """The signature names a key id that is not among the trusted keys."""

    reason = "BundleSignedByUnknownKey"
    exit_code = 65  # EX_DATAERR

    def __init__(self, message: str, *, key_id: bytes) -> None:
        super().__init__(message)
        self.key_id = key_id


class SignatureInvalid(PermanentError):
    """The signature of the message or of the trusted comment does not verify."""

    reason = "BundleSignatureInvalid"
    exit_code = 65  # EX_DATAERR


class KeyMalformed(PermanentError):
    """A public or secret key text is not a minisign Ed25519 key."""

    reason = "SigningKeyMalformed"
    exit_code = 78  # EX_CONFIG


class SecretKeyLocked(PermanentError):
    """The secret key is encrypted and the password is missing or wrong."""

    reason = "SigningKeyLocked"
    exit_code = 77  # EX_NOPERM


class ReleaseImageInvalid(PermanentError):
    """``bundle create --release``: the release image or its signatures are not usable."""

    reason = "ReleaseImageInvalid"
    exit_code = 65  # EX_DATAERR


class BundleError(PermanentError):
    """A bundle nodeagent refuses; the reason code says which rule it broke."""

    reason = "BundleInvalid"
    exit_code = 65  # EX_DATAERR


class BundleFormatUnsupported(BundleError):
    reason = "BundleFormatUnsupported"


class BundleManifestInvalid(BundleError):
    reason = "BundleManifestInvalid"


class BundleSetInvalid(BundleError):
    """A PinnedImageSet the bundle carries is not one the node would load (name, shape, images)."""

    reason = "BundleSetInvalid"


class BundleArchitectureMismatch(BundleError):
    """The bundle, or an image in it, is for another platform than this node's."""

    reason = "BundleArchitectureMismatch"


class BundleNotInTarget(BundleError):
    """The bundle's target (its signed ``nodeSelector``) does not select this node, or the
    node's labels are not known (no Kubernetes API): it is meant for other nodes."""

    reason = "BundleNotInTarget"


class BundleReleaseInvalid(BundleError):
    """``bundle.json``'s ``release`` object breaks a rule (docs/bundle-format.md R31, R32)."""

    reason = "BundleReleaseInvalid"


class BundleRollback(BundleError):
    """The bundle's signed ``sequence`` is lower than the highest this node accepted for
    the same signing key and channel, or equal to it with another manifest: the replay of an
    older, validly signed bundle (docs/bundle-format.md#anti-rollback)."""

    reason = "BundleRollback"


class BundleExpired(BundleError):
    """The bundle's signed ``expires`` time is past (by this node's clock)."""

    reason = "BundleExpired"


class BundleUnsafePath(BundleError):
    reason = "BundleUnsafePath"


class BundleUnsafeEntry(BundleError):
    reason = "BundleUnsafeEntry"


class BundleUnlistedFile(BundleError):
    reason = "BundleUnlistedFile"


class BundleIncomplete(BundleError):
    reason = "BundleIncomplete"


class BundleSizeMismatch(BundleError):
    reason = "BundleSizeMismatch"


class BundleDigestMismatch(BundleError):
    reason = "BundleDigestMismatch"


class MediaMountFailed(PermanentError):
    """Bundle media could not be mounted read-only; the message says why and what to do."""

    reason = "MediaMountFailed"
    exit_code = 74  # EX_IOERR


class MediaUnmountFailed(TransientError):
    """Bundle media could not be unmounted (usually: files on it are still open)."""

    reason = "MediaUnmountFailed"
    default_retry_after_s = 2.0


class MediaWatchFailed(TransientError):
    """The udev monitor could not be opened or failed while reading events."""

    reason = "MediaWatchFailed"
    default_retry_after_s = 5.0


class BundleMediaRemoved(NodeAgentError):
    """The medium went away during the import; complete images stay, the rest resumes later."""

    reason = "BundleMediaRemoved"
    exit_code = 75  # EX_TEMPFAIL


class ApiUnreachable(TransientError):
    """The Kubernetes API server does not answer; the node keeps working from its last specs."""

    reason = "ApiUnreachable"
    exit_code = 69  # EX_UNAVAILABLE
    default_retry_after_s = 2.0


class PeerAnswerInvalid(TransientError):
    """A peer answered with a document that is not what docs/site.md defines (malformed,
    out of range, contradicting itself): that peer is dropped and another one asked."""

    reason = "PeerAnswerInvalid"
    default_retry_after_s = 30.0


class PeerUnreachable(TransientError):
    """A peer did not answer as the protocol says: no connection, a TLS handshake refused, no
    progress for ``[site] request_timeout_s``, an answer cut short or an unexpected status.
    That peer is dropped for the bundle being fetched."""

    reason = "PeerUnreachable"
    default_retry_after_s = 30.0


class PeerBusy(TransientError):
    """A peer answered 429 or 503 (too many uploads): it is asked again after its
    ``Retry-After``, other peers meanwhile."""

    reason = "PeerBusy"
    default_retry_after_s = 2.0


class MetricsListenFailed(TransientError):
    """The metrics endpoint cannot listen on ``[metrics] listen`` (the port is taken, the
    address is not this node's); retried with backoff, pinning goes on without metrics."""

    reason = "MetricsListenFailed"
    default_retry_after_s = 30.0


class BundleFetchFailed(TransientError):
    """A bundle could not be fetched from any peer (every one was dropped or none holds what
    is missing); the fetch is tried again later, resuming what is stored."""

    reason = "NoPeerLeft"
    default_retry_after_s = 30.0


class KubeconfigInvalid(PermanentError):
    """The kubeconfig for cluster mode is missing, unreadable or incomplete."""

    reason = "KubeconfigInvalid"
    exit_code = 78  # EX_CONFIG


class ApiAccessDenied(PermanentError):
    """The API server refused the node's identity (401/403): RBAC or admission policy missing."""

    reason = "ApiAccessDenied"
    exit_code = 77  # EX_NOPERM


class ApiRequestRejected(PermanentError):
    """The API server rejected a request as invalid (4xx other than 401/403/404/409)."""

    reason = "ApiRequestRejected"


class PoolMembershipInvalid(PermanentError):
    """The node matches more than one custom MachineConfigPool, which the machine-config-operator
    refuses too (``GetPoolsForNode``): the node takes no pool's sets until its labels or the pools'
    node selectors leave it in one custom pool at most."""

    reason = "PoolMembershipInvalid"
    exit_code = 78  # EX_CONFIG


class NodeNotReady(TransientError):
    """The Node object is not Ready, or reports DiskPressure (reason ``NodeDiskPressure``):
    registry pulls wait until the kubelet reports it healthy again. Restores from the node's
    store and bundle imports are not held back."""

    reason = "NodeNotReady"
    default_retry_after_s = 10.0


class NodeDiskPressure(NodeNotReady):
    """The Node reports DiskPressure: registry pulls wait until the kubelet clears it."""

    reason = "NodeDiskPressure"


class PeerHoldingsInvalid(PermanentError):
    """A node's published NodeImageHoldings is not of the form nodeagent writes; that node is
    not used as a peer (and not counted as holding anything) until it publishes a valid one."""

    reason = "PeerHoldingsInvalid"
    exit_code = 65  # EX_DATAERR


class StoreError(PermanentError):
    """The node's image store (docs/store.md) refused or lost something."""

    reason = "StoreError"
    exit_code = 74  # EX_IOERR


class StoreFull(StoreError):
    """The blobs to copy would take the store past its size cap (``[store] max_bytes`` or
    ``max_percent``); refused before the first byte is written."""

    reason = "StoreFull"
    exit_code = 73  # EX_CANTCREAT


class StoreBlobCorrupt(StoreError):
    """A stored blob no longer matches its digest (damaged on disk); it is removed, not served."""

    reason = "StoreBlobCorrupt"


class StoreBlobMissing(StoreError):
    """The store holds no blob by that digest."""

    reason = "StoreBlobMissing"


class StoreSourceMismatch(StoreError):
    """Bytes offered for a digest (from a medium or a registry) are longer, shorter or other
    than that digest: nothing was stored."""

    reason = "StoreSourceMismatch"
    exit_code = 65  # EX_DATAERR

    def __init__(self, message: str, *, is_size: bool = False) -> None:
        super().__init__(message)
        self.is_size = is_size
        """The size was wrong (else the digest)."""


class StoreRecordDamaged(StoreError):
    """A record of the store (a bundle's record, the index, the removal marks) cannot be read;
    it is set aside and rebuilt from what the store holds."""

    reason = "StoreRecordDamaged"


def transient_reasons() -> frozenset[str]:
    """The reason codes of every ``TransientError``: a failure with one of them may go away."""
    found: set[str] = set()
    pending: list[type[NodeAgentError]] = [TransientError]
    while pending:
        cls = pending.pop()
        found.add(cls.reason)
        pending.extend(cls.__subclasses__())
    return frozenset(found)


def is_transient_reason(reason: str | None) -> bool:
    """Whether ``reason`` is the code of a transient error (retry soon, not at the resync)."""
    return reason is not None and reason in transient_reasons()
