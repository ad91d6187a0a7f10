"""Errors of pulling and pinning: CRI-O, registries, disk, configuration and host files."""

from __future__ import annotations

from nodeagent.errors.base import PermanentError, TransientError


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


class RegistryCertsInvalid(PermanentError):
    """A registry host's containers-certs.d(5) directory cannot be used: a client certificate
    without its key (or a key without its certificate), a file too large, unreadable or not
    PEM. CRI-O refuses that host too; nothing is sent to it until the directory is fixed."""

    reason = "RegistryCertsInvalid"


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


class RegistriesConfInvalid(ConfigInvalid):
    """registries.conf or one of its drop-ins, written by another component, breaks a rule
    containers/image enforces (not TOML, a wrong type, ``mirror-by-digest-only`` mixed with
    ``pull-from-mirror``, ...). Every pull on the node fails while it stays; nodeagent names
    the file, leaves it untouched and writes no mirror drop-in until it is fixed."""

    reason = "RegistriesConfInvalid"


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


class DaemonRunning(TransientError):
    """A by-hand command that changes the node's pins while the daemon owns them
    (``bundle import``: the daemon holds the pin lock for its whole life, decision 0044)."""

    reason = "DaemonRunning"
    exit_code = 75  # EX_TEMPFAIL


class ReleaseStateUnknown(TransientError):
    """``unpin`` or ``bundle remove`` of a release bundle's set when the cluster's upgrade
    state could not be read (not in cluster mode, the API unreachable, the pools or the
    ClusterVersion not known): unknown is never "safe to remove" (decision 0072)."""

    reason = "ReleaseStateUnknown"
    exit_code = 75  # EX_TEMPFAIL


class StickNotFound(TransientError):
    """``support-dump --to-stick`` found no stick nodeagent takes, or more than one."""

    reason = "StickNotFound"
    exit_code = 75  # EX_TEMPFAIL


class SetNotFound(PermanentError):
    """``unpin`` of a set no spec directory holds."""

    reason = "SetNotFound"
    exit_code = 66  # EX_NOINPUT


class BundleNotStored(PermanentError):
    """``bundle remove`` of a bundle id the store has no record of."""

    reason = "BundleNotStored"
    exit_code = 66  # EX_NOINPUT


class LifecycleRefused(PermanentError):
    """``unpin`` or ``bundle remove`` refused by a safety rule (decision 0072)."""

    reason = "LifecycleRefused"
    exit_code = 65  # EX_DATAERR


class SetFromApi(LifecycleRefused):
    """``unpin`` of a set the cluster's API gives: the next sync would pin it again."""

    reason = "SetFromApi"


class SetFileShared(LifecycleRefused):
    """``unpin`` of a local set whose file holds other sets too (never rewritten by hand)."""

    reason = "SetFileShared"


class BundleSetsPinned(LifecycleRefused):
    """``bundle remove`` of a bundle one of whose sets is still pinned."""

    reason = "BundleSetsPinned"


class ReleaseInUse(LifecycleRefused):
    """``unpin`` or ``bundle remove`` of the current or desired release, one an upgrade is
    asked for or moving to, or any release while an upgrade is under way."""

    reason = "ReleaseInUse"


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
