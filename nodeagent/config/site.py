"""``[site]``: sharing bundles with the site's other nodes (docs/site.md).

Its own module beside ``settings`` (which holds most other tables) to keep that file short;
``Config.site`` gathers it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SiteSettings:
    """Sharing bundles with the site's other nodes (``[site]``, docs/site.md).

    Each node may serve its store read-only to its peers over HTTPS with mutual TLS, and
    fetch bundles it sees on them. The certificate defaults are the kubelet's own (OpenShift
    and kubeadm nodes rotate them in place; nodeagent re-reads them when they change), so no
    new PKI is needed; docs/runtime-facts.md gives where they come from.
    """

    serve: bool = False
    """Serve the store to peers (the OCI distribution API and nodeagent's holdings, read
    only). Default false: nothing listens on the network unless asked."""
    listen: str = "0.0.0.0:9447"
    """``address:port`` the peer server binds (IPv6 as ``[::]:9447``). Default every IPv4
    address, port 9447 (open it between the site's nodes only; docs/site.md)."""
    advertise: str = ""
    """``host:port`` peers use to reach this node, published with its holdings. ``""``
    (default): the Node's InternalIP in cluster mode, else the listen address."""
    cert_file: Path = Path("/var/lib/kubelet/pki/kubelet-server-current.pem")
    """PEM certificate (chain) this node presents when it serves. Default the kubelet's
    serving certificate, which the kubelet rotates (the file holds the key too)."""
    key_file: Path = Path("/var/lib/kubelet/pki/kubelet-server-current.pem")
    """PEM private key of ``cert_file``."""
    client_cert_file: Path = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
    """PEM certificate this node presents when it fetches from a peer. Default the kubelet's
    client certificate (``system:node:<name>``; the file holds the key too)."""
    client_key_file: Path = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
    """PEM private key of ``client_cert_file``."""
    ca_file: Path = Path("/etc/kubernetes/kubelet-ca.crt")
    """PEM bundle of the CAs a peer's certificate must chain to, as client and as server.
    A peer whose certificate chains elsewhere fails the TLS handshake."""
    peers: tuple[str, ...] = ()
    """Without the API: the peers' ``host:port`` addresses (at most 256). In cluster mode the
    peers are discovered and this list is added to them. Default none."""
    follow: str = "auto"
    """Fetch the bundles seen on peers that this node's keys trust and whose target includes
    this node: ``on``, ``off`` or ``auto`` (default: on in cluster mode or with ``peers``)."""
    max_uploads: int = 3
    """Blob downloads this node serves at once (one peer at most half of them); beyond them a
    peer is answered 503 with ``Retry-After`` and goes elsewhere. Few uploads each at a good
    rate get whole blobs to peers sooner, which then serve them too (docs/performance.md,
    "Site fan-out"). Default 3. Range: from 1 to 256."""
    upload_max_bytes: int = 0
    """Upload bandwidth cap in bytes per second over all peers (a number or a size such as
    ``"40MiB"``), so production traffic keeps its share. ``0`` (default): no cap.
    Range: from 0 to 2^63-1 bytes."""
    fetch_concurrency: int = 8
    """Blobs this node fetches at once, from different peers where it can (each takes three
    threads, within the unit's TasksMax=128). Default 8. Range: from 1 to 16."""
    request_timeout_s: float = 60.0
    """A peer request (either side) that makes no progress for this long is dropped and the
    peer is dropped for that bundle. Default 60. Range: greater than 0 and at most 3600 seconds."""
    handshake_timeout_s: float = 5.0
    """A peer's TLS handshake must end within this long of its connection being accepted,
    else the connection is closed (``peer_refused``). A node on the site's network needs
    milliseconds; a connection that sends nothing holds its place until then. Separate from
    ``request_timeout_s``, which follows it (the first request, then each step). Default 5.
    Range: greater than 0 and at most 60 seconds."""
    max_connections: int = 256
    """Connections the peer server keeps open at once, handshakes in progress included; one
    more closes the oldest still in its TLS handshake, or is closed itself when there is
    none (``connections_capped``). A fetching node opens at most 4 to a peer: 256 lets 64
    nodes fetch from this one at once, and stays far below the unit's LimitNOFILE
    (docs/decisions/0052). Default 256. Range: from 1 to 1024."""
    max_connections_per_source: int = 8
    """Connections kept open at once from one source address (at most
    ``max_connections``); one more from it is closed as soon as it is accepted
    (``connections_refused``). Twice what a fetching node opens (4), for a restart's
    overlap or a technician's skopeo. Addresses behind one NAT share it. Default 8.
    Range: from 1 to 1024."""
    allow_from: tuple[str, ...] = ()
    """Source networks the peer server accepts connections from, e.g. ``["10.0.0.0/24",
    "fd00:1::/64"]`` (at most 256); any other is closed as soon as it is accepted
    (``connections_refused``). ``[]`` (default): any source, as the site's network is
    site-specific; the same list in the peer unit's ``IPAddressAllow=`` has the kernel drop
    them before nodeagent sees them (docs/site.md, "Connections")."""
    fetch_min_rate_bytes: int = 64 << 10
    """The slowest a peer may send, in bytes per second, measured over 5 s windows; each
    request also has a total deadline of 10 s + 10 s + its size at this rate. A slower peer
    is cut off, dropped for the bundle and demoted (docs/site.md, "Fetch"), so a peer that
    sends a byte now and then never holds a fetch. Keep it below the peers'
    ``upload_max_bytes`` / ``max_uploads``. Default 64 KiB (512 kbit/s). Range: from 1024 to
    1073741824 bytes."""
