"""Errors of the cluster API, the site's peers and the node's image store."""

from __future__ import annotations

from nodeagent.errors.base import PermanentError, TransientError


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


class PeerTooSlow(PeerUnreachable):
    """A peer sent its answer slower than ``[site] fetch_min_rate_bytes`` a second (over a
    few seconds), or not whole within the request's deadline: a peer that sends a byte now
    and then is cut off, dropped for the bundle and demoted for a while."""

    reason = "PeerTooSlow"


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


class SiteCertificatesInvalid(PermanentError):
    """The certificate, key or CA a ``[site]`` role needs is missing, unreadable or does
    not load (the key not the certificate's, a CA that is no certificate)."""

    reason = "SiteCertificatesInvalid"
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
