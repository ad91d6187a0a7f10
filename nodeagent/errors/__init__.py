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
    │   │   └── PeerTooSlow             PeerTooSlow (under the minimum rate, past the deadline)
    │   ├── PeerBusy                    PeerBusy (a peer answered 429/503: ask it later)
    │   ├── MetricsListenFailed         MetricsListenFailed ([metrics] listen cannot be bound)
    │   ├── DaemonRunning               DaemonRunning (a by-hand import while the daemon runs)
    │   ├── ReleaseStateUnknown         ReleaseStateUnknown (unpin/remove: upgrade state unread)
    │   ├── StickNotFound               StickNotFound (support-dump --to-stick: none, or several)
    │   └── BundleFetchFailed           NoPeerLeft (every peer was dropped; tried again later)
    └── PermanentError                  (retrying the same thing will not help)
        ├── ImageNotFound               ImageNotFound
        ├── RegistryAuthFailed          RegistryAuthFailed
        ├── RegistryCertsInvalid        RegistryCertsInvalid (a host's certs.d directory)
        ├── NoSpaceLeft                 NoSpaceLeft
        ├── RuntimeCallFailed           RuntimeCallFailed
        ├── RuntimeDoesNotPin           RuntimeDoesNotPin
        ├── PinsOverridden              PinsOverridden
        ├── RuntimeConfigInvalid        RuntimeConfigInvalid (another component's CRI-O file)
        ├── InsufficientDiskSpace       InsufficientDiskSpace
        ├── ConfigInvalid               ConfigInvalid
        │   └── RegistriesConfInvalid   RegistriesConfInvalid (another component's registries.conf)
        ├── AuthFileInvalid             AuthFileInvalid
        ├── SpecInvalid                 SpecInvalid
        │   └── ImageReferenceInvalid   ImageReferenceInvalid
        ├── SetNotFound                 SetNotFound (unpin: no spec file holds the set)
        ├── BundleNotStored             BundleNotStored (bundle remove: no such record)
        ├── LifecycleRefused            (unpin, bundle remove: a safety rule, decision 0072)
        │   ├── SetFromApi              SetFromApi (the next sync would pin it again)
        │   ├── SetFileShared           SetFileShared (its file holds other sets too)
        │   ├── BundleSetsPinned        BundleSetsPinned (unpin its sets first)
        │   └── ReleaseInUse            ReleaseInUse (current, desired or upgrade target)
        ├── HostFileError               HostFileError
        │   └── StateFileDamaged        StateFileDamaged
        ├── SignatureMissing            BundleUnsigned
        ├── SignatureMalformed          BundleSignatureMalformed
        │   └── SignatureLegacy         BundleSignatureLegacy
        ├── UnknownSigningKey           BundleSignedByUnknownKey
        ├── SignatureInvalid            BundleSignatureInvalid
        ├── Ed25519Refused              Ed25519Refused (the crypto backend, FIPS: decision 0075)
        ├── KeyMalformed                SigningKeyMalformed
        ├── ReleaseImageInvalid         ReleaseImageInvalid (bundle create --release input)
        │   └── ReleaseUnsigned         ReleaseUnsigned (no release signature to carry)
        ├── ReleaseNotAnUpgrade         ReleaseNotAnUpgrade (not from the cluster's version)
        ├── AgentImageRefused           (a bundle's nodeagent image, decision 0074)
        │   ├── ImageSignatureInvalid   ImageSignatureInvalid (no agent image key signed it)
        │   ├── ImageStatementInvalid   ImageStatementInvalid
        │   ├── ImageDigestMismatch     ImageDigestMismatch (the statement signs another image)
        │   ├── ImageRollback           ImageRollback (older than the newest taken, or rejected)
        │   └── ImageStageFailed        ImageStageFailed (not handed to the host's loader)
        ├── SecretKeyLocked             SigningKeyLocked
        ├── MediaMountFailed            MediaMountFailed
        ├── BundleMediaRefused          BundleMediaRefused (a filesystem or bus not allowed)
        ├── KubeconfigInvalid           KubeconfigInvalid
        ├── SiteCertificatesInvalid     SiteCertificatesInvalid (a [site] role's TLS files)
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
            ├── BundleTagsInvalid       BundleTagsInvalid (bundle.json's servedTags)
            ├── BundleArchitectureMismatch BundleArchitectureMismatch
            ├── BundleNotInTarget       BundleNotInTarget (the target leaves the node out)
            ├── BundleReleaseInvalid    BundleReleaseInvalid (bundle.json's release object)
            ├── BundleRollback          BundleRollback (older than a bundle already accepted)
            │   └── BundleFormatDowngrade BundleFormatDowngrade (an older format after a newer)
            ├── BundleExpired           BundleExpired (its signed expiry time is past)
            ├── BundleUnsafePath        BundleUnsafePath
            ├── BundleUnsafeEntry       BundleUnsafeEntry
            ├── BundleUnlistedFile      BundleUnlistedFile
            ├── BundleIncomplete        BundleIncomplete
            ├── BundleSizeMismatch      BundleSizeMismatch
            ├── BundleDigestMismatch    BundleDigestMismatch
            └── BundleServerFailed      (the session's loopback server process, decision 0064)
                ├── BundleServerLost    BundleServerLost (it ended before the session)
                └── BundleServerReportInvalid BundleServerReportInvalid (a line refused)
    NodeAgentError
    └── BundleMediaRemoved              BundleMediaRemoved (import interrupted; resumes)

The CLI exits with ``exit_code`` (sysexits.h values where one fits), so a
script can tell "try again later" (75, 69) from "fix the input" (78, 1).

Adapters wrap third-party exceptions into this tree with ``raise ... from``,
so the original cause stays visible in tracebacks while the rest of the code
only ever deals with these types.
"""

from __future__ import annotations

from nodeagent.errors.base import NodeAgentError as NodeAgentError
from nodeagent.errors.base import PermanentError as PermanentError
from nodeagent.errors.base import TransientError as TransientError
from nodeagent.errors.base import is_transient_reason as is_transient_reason
from nodeagent.errors.base import transient_reasons as transient_reasons
from nodeagent.errors.bundles import AgentImageRefused as AgentImageRefused
from nodeagent.errors.bundles import BundleArchitectureMismatch as BundleArchitectureMismatch
from nodeagent.errors.bundles import BundleDigestMismatch as BundleDigestMismatch
from nodeagent.errors.bundles import BundleError as BundleError
from nodeagent.errors.bundles import BundleExpired as BundleExpired
from nodeagent.errors.bundles import BundleFormatDowngrade as BundleFormatDowngrade
from nodeagent.errors.bundles import BundleFormatUnsupported as BundleFormatUnsupported
from nodeagent.errors.bundles import BundleIncomplete as BundleIncomplete
from nodeagent.errors.bundles import BundleManifestInvalid as BundleManifestInvalid
from nodeagent.errors.bundles import BundleMediaRefused as BundleMediaRefused
from nodeagent.errors.bundles import BundleMediaRemoved as BundleMediaRemoved
from nodeagent.errors.bundles import BundleNotInTarget as BundleNotInTarget
from nodeagent.errors.bundles import BundleReleaseInvalid as BundleReleaseInvalid
from nodeagent.errors.bundles import BundleRollback as BundleRollback
from nodeagent.errors.bundles import BundleServerFailed as BundleServerFailed
from nodeagent.errors.bundles import BundleServerLost as BundleServerLost
from nodeagent.errors.bundles import BundleServerReportInvalid as BundleServerReportInvalid
from nodeagent.errors.bundles import BundleSetInvalid as BundleSetInvalid
from nodeagent.errors.bundles import BundleSizeMismatch as BundleSizeMismatch
from nodeagent.errors.bundles import BundleTagsInvalid as BundleTagsInvalid
from nodeagent.errors.bundles import BundleUnlistedFile as BundleUnlistedFile
from nodeagent.errors.bundles import BundleUnsafeEntry as BundleUnsafeEntry
from nodeagent.errors.bundles import BundleUnsafePath as BundleUnsafePath
from nodeagent.errors.bundles import Ed25519Refused as Ed25519Refused
from nodeagent.errors.bundles import ImageDigestMismatch as ImageDigestMismatch
from nodeagent.errors.bundles import ImageRollback as ImageRollback
from nodeagent.errors.bundles import ImageSignatureInvalid as ImageSignatureInvalid
from nodeagent.errors.bundles import ImageStageFailed as ImageStageFailed
from nodeagent.errors.bundles import ImageStatementInvalid as ImageStatementInvalid
from nodeagent.errors.bundles import KeyMalformed as KeyMalformed
from nodeagent.errors.bundles import MediaMountFailed as MediaMountFailed
from nodeagent.errors.bundles import MediaUnmountFailed as MediaUnmountFailed
from nodeagent.errors.bundles import MediaWatchFailed as MediaWatchFailed
from nodeagent.errors.bundles import ReleaseImageInvalid as ReleaseImageInvalid
from nodeagent.errors.bundles import ReleaseNotAnUpgrade as ReleaseNotAnUpgrade
from nodeagent.errors.bundles import ReleaseUnsigned as ReleaseUnsigned
from nodeagent.errors.bundles import SecretKeyLocked as SecretKeyLocked
from nodeagent.errors.bundles import SignatureInvalid as SignatureInvalid
from nodeagent.errors.bundles import SignatureLegacy as SignatureLegacy
from nodeagent.errors.bundles import SignatureMalformed as SignatureMalformed
from nodeagent.errors.bundles import SignatureMissing as SignatureMissing
from nodeagent.errors.bundles import UnknownSigningKey as UnknownSigningKey
from nodeagent.errors.runtime import AuthFileInvalid as AuthFileInvalid
from nodeagent.errors.runtime import BundleNotStored as BundleNotStored
from nodeagent.errors.runtime import BundleSetsPinned as BundleSetsPinned
from nodeagent.errors.runtime import ConfigInvalid as ConfigInvalid
from nodeagent.errors.runtime import DaemonRunning as DaemonRunning
from nodeagent.errors.runtime import HostFileError as HostFileError
from nodeagent.errors.runtime import ImageNotFound as ImageNotFound
from nodeagent.errors.runtime import ImageReferenceInvalid as ImageReferenceInvalid
from nodeagent.errors.runtime import InsufficientDiskSpace as InsufficientDiskSpace
from nodeagent.errors.runtime import LifecycleRefused as LifecycleRefused
from nodeagent.errors.runtime import NoSpaceLeft as NoSpaceLeft
from nodeagent.errors.runtime import PinsOverridden as PinsOverridden
from nodeagent.errors.runtime import PullStalled as PullStalled
from nodeagent.errors.runtime import RegistriesConfInvalid as RegistriesConfInvalid
from nodeagent.errors.runtime import RegistryAuthFailed as RegistryAuthFailed
from nodeagent.errors.runtime import RegistryCertsInvalid as RegistryCertsInvalid
from nodeagent.errors.runtime import RegistryError as RegistryError
from nodeagent.errors.runtime import RegistryUnavailable as RegistryUnavailable
from nodeagent.errors.runtime import ReleaseInUse as ReleaseInUse
from nodeagent.errors.runtime import ReleaseStateUnknown as ReleaseStateUnknown
from nodeagent.errors.runtime import RuntimeCallFailed as RuntimeCallFailed
from nodeagent.errors.runtime import RuntimeConfigInvalid as RuntimeConfigInvalid
from nodeagent.errors.runtime import RuntimeDoesNotPin as RuntimeDoesNotPin
from nodeagent.errors.runtime import RuntimeReloadFailed as RuntimeReloadFailed
from nodeagent.errors.runtime import RuntimeTimeout as RuntimeTimeout
from nodeagent.errors.runtime import RuntimeUnreachable as RuntimeUnreachable
from nodeagent.errors.runtime import SetFileShared as SetFileShared
from nodeagent.errors.runtime import SetFromApi as SetFromApi
from nodeagent.errors.runtime import SetNotFound as SetNotFound
from nodeagent.errors.runtime import SizeUnknown as SizeUnknown
from nodeagent.errors.runtime import SpecInvalid as SpecInvalid
from nodeagent.errors.runtime import StateFileDamaged as StateFileDamaged
from nodeagent.errors.runtime import StickNotFound as StickNotFound
from nodeagent.errors.site import ApiAccessDenied as ApiAccessDenied
from nodeagent.errors.site import ApiRequestRejected as ApiRequestRejected
from nodeagent.errors.site import ApiUnreachable as ApiUnreachable
from nodeagent.errors.site import BundleFetchFailed as BundleFetchFailed
from nodeagent.errors.site import KubeconfigInvalid as KubeconfigInvalid
from nodeagent.errors.site import MetricsListenFailed as MetricsListenFailed
from nodeagent.errors.site import NodeDiskPressure as NodeDiskPressure
from nodeagent.errors.site import NodeNotReady as NodeNotReady
from nodeagent.errors.site import PeerAnswerInvalid as PeerAnswerInvalid
from nodeagent.errors.site import PeerBusy as PeerBusy
from nodeagent.errors.site import PeerHoldingsInvalid as PeerHoldingsInvalid
from nodeagent.errors.site import PeerTooSlow as PeerTooSlow
from nodeagent.errors.site import PeerUnreachable as PeerUnreachable
from nodeagent.errors.site import PoolMembershipInvalid as PoolMembershipInvalid
from nodeagent.errors.site import SiteCertificatesInvalid as SiteCertificatesInvalid
from nodeagent.errors.site import StoreBlobCorrupt as StoreBlobCorrupt
from nodeagent.errors.site import StoreBlobMissing as StoreBlobMissing
from nodeagent.errors.site import StoreError as StoreError
from nodeagent.errors.site import StoreFull as StoreFull
from nodeagent.errors.site import StoreRecordDamaged as StoreRecordDamaged
from nodeagent.errors.site import StoreSourceMismatch as StoreSourceMismatch
