"""TLS for registries: a verifying context from ``ca_file`` or the system's CA directory."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Final

SYSTEM_CA_DIRS: Final = (
    Path("/etc/pki/ca-trust/extracted/pem/directory-hash"),  # RHEL 9+, Fedora
    Path("/etc/ssl/certs"),  # Debian, Ubuntu, SUSE
)
_HASHED_NAME: Final = re.compile(r"[0-9a-f]{8}\.[0-9]+")


def tls_context(ca_file: Path | None, ca_dirs: Sequence[Path] = SYSTEM_CA_DIRS) -> ssl.SSLContext:
    """The verifying TLS context for registries.

    ``ca_file`` alone when given. Otherwise the system's CAs from the first hashed directory
    of ``ca_dirs`` (OpenSSL opens a CA there only when a chain names it): loading the whole
    bundle up front keeps ~140 parsed certificates, 1.2 MiB, in a daemon that may only ever
    talk to one registry. Without such a directory, or when ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` say otherwise, OpenSSL's defaults as usual.
    """
    if ca_file is not None:
        return ssl.create_default_context(cafile=str(ca_file))
    if not {"SSL_CERT_FILE", "SSL_CERT_DIR"} & os.environ.keys():
        for directory in ca_dirs:
            if _is_hashed_dir(directory):
                return ssl.create_default_context(capath=str(directory))
    return ssl.create_default_context()


def _is_hashed_dir(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(_HASHED_NAME.fullmatch(entry.name) for entry in entries)
    except OSError:
        return False


CERTS_DIRS: Final = (Path("/etc/containers/certs.d"), Path("/etc/docker/certs.d"))
"""Per-registry CA directories, containers-certs.d(5): ``<dir>/<host[:port]>/*.crt``."""
MAX_HOST_CAS: Final = 64


def host_ca_files(certs_dirs: Sequence[Path], host: str) -> tuple[Path, ...]:
    """The ``*.crt`` CA files for ``host`` (``name[:port]``), sorted, from the first of
    ``certs_dirs`` that has a directory for it (as containers/image picks one); none for a
    host that is not a plain directory name (it would leave the directory)."""
    if not host or host in {".", ".."} or "/" in host or "\\" in host or "\0" in host:
        return ()
    for root in certs_dirs:
        try:
            with os.scandir(root / host) as entries:
                names = sorted(e.name for e in entries if e.name.endswith(".crt") and e.is_file())
        except OSError:  # missing or unreadable: the next directory, as containers/image does
            continue
        return tuple(root / host / name for name in names[:MAX_HOST_CAS])
    return ()


class HostContexts:
    """TLS contexts per registry host: the common one, or one that also trusts the host's
    certs.d CAs (made again when those files change)."""

    def __init__(
        self, ca_file: Path | None, ca_dirs: Sequence[Path], certs_dirs: Sequence[Path]
    ) -> None:
        self._ca_file, self._ca_dirs, self._certs_dirs = ca_file, ca_dirs, certs_dirs
        self._common: ssl.SSLContext | None = None
        """Made for the first HTTPS request: loading the CAs costs 1-2 MiB that HTTP never needs."""
        self._by_host: dict[str, tuple[tuple[tuple[str, int], ...], ssl.SSLContext]] = {}

    def for_host(self, host: str) -> ssl.SSLContext:
        """The context for ``host``; ``ssl.SSLError`` or ``OSError`` for a broken CA file."""
        files = host_ca_files(self._certs_dirs, host)
        if not files:
            if self._common is None:
                self._common = tls_context(self._ca_file, self._ca_dirs)
            return self._common
        stamp = tuple((str(path), path.stat().st_mtime_ns) for path in files)
        known = self._by_host.get(host)
        if known is not None and known[0] == stamp:
            return known[1]
        context = tls_context(self._ca_file, self._ca_dirs)
        for path in files:
            context.load_verify_locations(cafile=str(path))
        self._by_host[host] = (stamp, context)
        return context
