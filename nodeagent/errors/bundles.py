"""Errors of signed bundles: signatures and keys, bundle contents, release input, media."""

from __future__ import annotations

from nodeagent.errors.base import NodeAgentError, PermanentError, TransientError


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


class Ed25519Refused(PermanentError):
    """The crypto backend refuses Ed25519 (an OpenSSL FIPS provider does: decision 0075), so
    no minisign signature can be verified on this node; or the host is in FIPS mode and the
    bundle has no ECDSA signature, the only one that counts there."""

    reason = "Ed25519Refused"
    exit_code = 69  # EX_UNAVAILABLE


class KeyMalformed(PermanentError):
    """A public or secret key text is not a minisign Ed25519 key, nor an ECDSA P-256 or P-384
    key in PEM (decision 0075)."""

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


class ReleaseUnsigned(ReleaseImageInvalid):
    """``bundle create --release --require-signatures``: no release signature to carry."""

    reason = "ReleaseUnsigned"


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


class BundleTagsInvalid(BundleError):
    """``servedTags`` (``bundle create --serve-tags``) breaks rule R42: a malformed tag, too
    many, or a digest that is not one of the bundle's images of that repository."""

    reason = "BundleTagsInvalid"


class BundleArchitectureMismatch(BundleError):
    """The bundle, or an image in it, is for another platform than this node's."""

    reason = "BundleArchitectureMismatch"


class BundleNotInTarget(BundleError):
    """The bundle's target (its signed ``nodeSelector``) does not select this node, or the
    node's labels are not known (no Kubernetes API): it is meant for other nodes."""

    reason = "BundleNotInTarget"


class ReleaseNotAnUpgrade(PermanentError):
    """A release does not upgrade the cluster's version: its ``release-metadata`` does not list
    that version in ``previous``, or it is older (a downgrade is never proposed). At
    ``bundle create --release … --from-version`` the bundle is not made; on a node the bundle is
    still loaded and pinned, and reported with both versions (decision 0065)."""

    reason = "ReleaseNotAnUpgrade"
    exit_code = 65  # EX_DATAERR


class AgentImageRefused(PermanentError):
    """A bundle's nodeagent image (``agentImage``) is not switched to (decision 0074); the
    bundle's other images are imported and pinned all the same."""

    reason = "ImageRefused"
    exit_code = 65  # EX_DATAERR


class ImageSignatureInvalid(AgentImageRefused):
    """No agent image key (``[bundles] image_keys_dir``) signed the image's statement."""

    reason = "ImageSignatureInvalid"


class ImageStatementInvalid(AgentImageRefused):
    """The image's statement is not a ``nodeagent-image-statement-v2``."""

    reason = "ImageStatementInvalid"


class ImageDigestMismatch(AgentImageRefused):
    """The statement signs another image than the one the bundle carries."""

    reason = "ImageDigestMismatch"


class ImageRollback(AgentImageRefused):
    """Older than (or another under the same sequence as) the newest image this node took,
    or rolled back on this node before."""

    reason = "ImageRollback"


class ImageStageFailed(AgentImageRefused):
    """The image could not be handed to the host's loader (its blobs, the disk)."""

    reason = "ImageStageFailed"
    exit_code = 74  # EX_IOERR


class BundleReleaseInvalid(BundleError):
    """``bundle.json``'s ``release`` object breaks a rule (docs/bundle-format.md R31, R32)."""

    reason = "BundleReleaseInvalid"


class BundleRollback(BundleError):
    """The bundle's signed ``sequence`` is lower than the highest this node accepted for
    the same signing key and channel, or equal to it with another manifest: the replay of an
    older, validly signed bundle (docs/bundle-format.md#anti-rollback)."""

    reason = "BundleRollback"


class BundleFormatDowngrade(BundleRollback):
    """The bundle's ``formatVersion`` is lower than that of a bundle this node accepted from
    the same signing key (or a key that supersedes it, or that it supersedes): an old-format
    bundle, whose sequence is only its creation second, replayed after the key moved on."""

    reason = "BundleFormatDowngrade"


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


class BundleServerFailed(BundleError):
    """The mirror session's loopback server (``nodeagent serve-session``, decision 0064)
    failed: not the bundle's fault. The import stops with what is in; it is tried again
    as any stopped import is (the medium plugged in again, the next sync's restore)."""

    reason = "BundleServerFailed"


class BundleServerLost(BundleServerFailed):
    """The session's server process ended (or could not start) before the session did."""

    reason = "BundleServerLost"


class BundleServerReportInvalid(BundleServerFailed):
    """The session's server process sent a line the daemon refuses; it was stopped."""

    reason = "BundleServerReportInvalid"


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


class BundleMediaRefused(PermanentError):
    """A medium labelled for nodeagent holds a filesystem, or sits on a bus, that nodeagent
    does not mount (``[bundles] media_fs_types``, ``media_buses``); nothing was mounted."""

    reason = "BundleMediaRefused"
    exit_code = 65  # EX_DATAERR


class BundleMediaRemoved(NodeAgentError):
    """The medium went away during the import; complete images stay, the rest resumes later."""

    reason = "BundleMediaRemoved"
    exit_code = 75  # EX_TEMPFAIL
