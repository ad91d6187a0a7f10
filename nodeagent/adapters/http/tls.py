"""Mutual TLS for the peer server, with certificates re-read when they are rotated.

The server presents ``cert_file``/``key_file`` and requires a client certificate that
chains to ``ca_file`` (TLS 1.2 or later): a peer without one, or with one from another CA,
fails the handshake. On OpenShift these are the kubelet's files, which the kubelet
replaces in place when it rotates them (docs/runtime-facts.md).

Rotation: at each handshake (the ``sni_callback``, which OpenSSL calls for every
ClientHello, with or without a server name) the three files' identities (device, inode,
size, modification time, following links: the kubelet's ``*-current.pem`` is a link it
re-points) are compared with those of the context in use; when one changed, a new context
is built from the files and the connection switched to it (``SSLSocket.context``). A set of
files that does not load (caught mid-rotation, or broken) leaves the previous context in
use and is logged once (``peer_tls_reload_failed``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import structlog

from nodeagent.errors import ConfigInvalid
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

FileIdentity = tuple[tuple[int, int, int, int] | None, ...]


def _identity(paths: tuple[Path, ...]) -> FileIdentity:
    identity: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            identity.append(None)
            continue
        identity.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(identity)


def server_context(cert_file: Path, key_file: Path, ca_file: Path) -> ssl.SSLContext:
    """A TLS server context that presents the certificate and requires a client's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(cert_file, key_file)
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as err:
        raise ConfigInvalid(
            f"[site] cannot load the peer server's TLS files (cert_file {cert_file}, key_file "
            f"{key_file}, ca_file {ca_file}): {clip(err, 200)}; check that they exist and hold "
            "PEM certificates and the matching key"
        ) from err
    return context


class ReloadingTls:
    """The server context for ``create_server``: switches each new connection to the files'
    current certificates."""

    def __init__(self, cert_file: Path, key_file: Path, ca_file: Path) -> None:
        self._paths = (cert_file, key_file, ca_file)
        self._identity = _identity(self._paths)
        self._current = server_context(cert_file, key_file, ca_file)
        self._failed_identity: FileIdentity | None = None
        self.reloads = 0
        """Contexts built since start because the files changed."""
        self.context = server_context(cert_file, key_file, ca_file)
        self.context.sni_callback = self._on_hello

    def _on_hello(
        self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext
    ) -> None:
        self.refresh()
        connection.context = self._current

    def refresh(self) -> None:
        """Build a new context when the files changed since the one in use was built."""
        identity = _identity(self._paths)
        if identity in (self._identity, self._failed_identity):
            return
        try:
            self._current = server_context(*self._paths)
        except ConfigInvalid as err:
            self._failed_identity = identity
            log.warning("peer_tls_reload_failed", error=str(err))
            return
        self._identity, self._failed_identity = identity, None
        self.reloads += 1
        log.info("peer_tls_reloaded", cert_file=str(self._paths[0]))


def client_context(cert_file: Path, key_file: Path, ca_file: Path) -> ssl.SSLContext:
    """A TLS client context that presents the node's certificate and checks the peer's:
    chained to ``ca_file`` and naming the address asked (peers are asked by IP address, so
    their certificates carry it as an IP SAN, as the kubelet's serving certificate does)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as err:
        raise ConfigInvalid(
            f"[site] cannot load the fetcher's TLS files (client_cert_file {cert_file}, "
            f"client_key_file {key_file}, ca_file {ca_file}): {clip(err, 200)}; check that "
            "they exist and hold PEM certificates and the matching key"
        ) from err
    return context


class ReloadingClientTls:
    """The fetcher's client context, built again when its files changed (looked at before
    each request: the kubelet rotates its client certificate in place). Files that do not
    load leave the previous context in use, logged once (``peer_tls_reload_failed``)."""

    def __init__(self, cert_file: Path, key_file: Path, ca_file: Path) -> None:
        self._paths = (cert_file, key_file, ca_file)
        self._identity = _identity(self._paths)
        self._context = client_context(cert_file, key_file, ca_file)
        self._failed_identity: FileIdentity | None = None
        self.reloads = 0

    @property
    def context(self) -> ssl.SSLContext:
        identity = _identity(self._paths)
        if identity in (self._identity, self._failed_identity):
            return self._context
        try:
            self._context = client_context(*self._paths)
        except ConfigInvalid as err:
            self._failed_identity = identity
            log.warning("peer_tls_reload_failed", side="client", error=str(err))
            return self._context
        self._identity, self._failed_identity = identity, None
        self.reloads += 1
        log.info("peer_tls_reloaded", side="client", cert_file=str(self._paths[0]))
        return self._context
