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
from collections.abc import Callable
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


def _load(
    context: ssl.SSLContext, files: tuple[Path, Path, Path], what: str, names: tuple[str, str]
) -> ssl.SSLContext:
    """``context`` with its certificate and key (``names``: their settings) and the CA."""
    cert_file, key_file, ca_file = files
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as err:
        raise ConfigInvalid(
            f"[site] cannot load {what}'s TLS files ({names[0]} {cert_file}, {names[1]} "
            f"{key_file}, ca_file {ca_file}): {clip(err, 200)}; check that they exist and "
            "hold PEM certificates and the matching key"
        ) from err
    return context


def server_context(cert_file: Path, key_file: Path, ca_file: Path) -> ssl.SSLContext:
    """A TLS server context that presents the certificate and requires a client's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = ssl.CERT_REQUIRED
    files = (cert_file, key_file, ca_file)
    return _load(context, files, "the peer server", ("cert_file", "key_file"))


def client_context(cert_file: Path, key_file: Path, ca_file: Path) -> ssl.SSLContext:
    """A TLS client context that presents the node's certificate and checks the peer's:
    chained to ``ca_file`` and naming the address asked (peers are asked by IP address, so
    their certificates carry it as an IP SAN, as the kubelet's serving certificate does)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    files = (cert_file, key_file, ca_file)
    return _load(context, files, "the fetcher", ("client_cert_file", "client_key_file"))


class _Reloading:
    """A context built from three files, built again when one of them changed. Files that
    do not load leave the previous context in use, logged once (``peer_tls_reload_failed``)."""

    def __init__(
        self, paths: tuple[Path, Path, Path], build: Callable[..., ssl.SSLContext], side: str
    ) -> None:
        self._paths, self._build, self._side = paths, build, side
        self._identity = _identity(paths)
        self._context = build(*paths)
        self._failed_identity: FileIdentity | None = None
        self.reloads = 0
        """Contexts built since start because the files changed."""

    def current(self) -> ssl.SSLContext:
        identity = _identity(self._paths)
        if identity in (self._identity, self._failed_identity):
            return self._context
        try:
            self._context = self._build(*self._paths)
        except ConfigInvalid as err:
            self._failed_identity = identity
            log.warning("peer_tls_reload_failed", side=self._side, error=str(err))
            return self._context
        self._identity, self._failed_identity = identity, None
        self.reloads += 1
        log.info("peer_tls_reloaded", side=self._side, cert_file=str(self._paths[0]))
        return self._context


class ReloadingTls:
    """The server context for ``create_server``: switches each new connection to the files'
    current certificates."""

    def __init__(self, cert_file: Path, key_file: Path, ca_file: Path) -> None:
        self._files = _Reloading((cert_file, key_file, ca_file), server_context, "server")
        self.context = server_context(cert_file, key_file, ca_file)
        self.context.sni_callback = self._on_hello

    @property
    def reloads(self) -> int:
        return self._files.reloads

    def _on_hello(
        self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext
    ) -> None:
        connection.context = self._files.current()


class ReloadingClientTls:
    """The fetcher's client context, built again when its files changed (looked at before
    each request: the kubelet rotates its client certificate in place)."""

    def __init__(self, cert_file: Path, key_file: Path, ca_file: Path) -> None:
        self._files = _Reloading((cert_file, key_file, ca_file), client_context, "client")

    @property
    def reloads(self) -> int:
        return self._files.reloads

    @property
    def context(self) -> ssl.SSLContext:
        return self._files.current()
