"""TLS for registries: a verifying context from ``ca_file`` or the system's CA directory, and
per host what its containers-certs.d(5) directory adds (docs/runtime-facts.md): ``*.crt`` CAs
trusted besides those, a ``*.cert`` client certificate with its ``*.key`` presented for mutual
TLS. A certificate without its key (or a key without its certificate) makes the host unusable
with ``RegistryCertsInvalid``, as containers/image refuses it; of several pairs the first by
name is presented (Python's TLS takes one, Go's picks among them per server)."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodeagent.errors import RegistryCertsInvalid
from nodeagent.strict import clip, quoted

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
"""Per-registry TLS directories, containers-certs.d(5): ``<dir>/<host[:port]>/``."""
MAX_HOST_FILES: Final = 64
"""Files of one host's directory that are read; more is ``RegistryCertsInvalid``."""
MAX_CERTS_FILE_BYTES: Final = 1 << 20
"""One CA bundle, client certificate or key; a larger file is ``RegistryCertsInvalid``."""


@dataclass(frozen=True, slots=True)
class HostCerts:
    """What a host's certs.d directory holds: ``*.crt`` CAs, the first ``*.cert``/``*.key``
    client pair by name, or why the directory cannot be used (``problem``)."""

    directory: Path | None = None
    cas: tuple[Path, ...] = ()
    pair: tuple[Path, Path] | None = None
    problem: str = ""

    @property
    def files(self) -> tuple[Path, ...]:
        return self.cas + (self.pair or ())


def host_certs(certs_dirs: Sequence[Path], host: str) -> HostCerts:
    """The certs.d directory for ``host`` (``name[:port]``) from the first of ``certs_dirs``
    that has one (as containers/image picks it), its files sorted by name; nothing for a
    host that is not a plain directory name (the path would leave ``certs_dirs``)."""
    if not host or host in {".", ".."} or "/" in host or "\\" in host or "\0" in host:
        return HostCerts()
    for root in certs_dirs:
        directory = root / host
        try:
            with os.scandir(directory) as entries:
                names = sorted(e.name for e in entries if e.is_file())
        except OSError:  # missing or unreadable: the next directory, as containers/image does
            continue
        return _listed_certs(directory, names)
    return HostCerts()


def _listed_certs(directory: Path, names: Sequence[str]) -> HostCerts:
    listed = frozenset(names)
    wanted = [n for n in names if n.endswith((".crt", ".cert", ".key"))]
    if len(wanted) > MAX_HOST_FILES:
        return HostCerts(directory, problem=f"holds {len(wanted)} certificate and key files, "
                         f"more than the {MAX_HOST_FILES} nodeagent reads")  # fmt: skip
    for name in wanted:
        problem = _unpaired(name, listed)
        if problem:
            return HostCerts(directory, problem=problem)
    cas = tuple(directory / n for n in wanted if n.endswith(".crt"))
    certs = [n for n in wanted if n.endswith(".cert")]
    pair = (directory / certs[0], directory / f"{certs[0][:-5]}.key") if certs else None
    return HostCerts(directory, cas, pair)


def _unpaired(name: str, listed: frozenset[str]) -> str:
    """Why ``name`` cannot be used without its other half; empty when it can."""
    stem, dot, suffix = name.rpartition(".")
    other = {"cert": "key", "key": "cert"}.get(suffix)
    if not dot or other is None or f"{stem}.{other}" in listed:
        return ""
    if suffix == "cert":
        return (f"client certificate {quoted(name, 80)} has no key {quoted(stem + '.key', 80)} "
                "beside it (a CA certificate must end in .crt)")  # fmt: skip
    return (
        f"key {quoted(name, 80)} has no client certificate {quoted(stem + '.cert', 80)} beside it"
    )


def _no_password() -> bytes:
    """An encrypted key is refused (OpenSSL would otherwise prompt on a terminal)."""
    return b""


class HostContexts:
    """TLS contexts per registry host: the common one, or one that also trusts the host's
    certs.d CAs and presents its client certificate (made again when those files change)."""

    def __init__(
        self, ca_file: Path | None, ca_dirs: Sequence[Path], certs_dirs: Sequence[Path]
    ) -> None:
        self._ca_file, self._ca_dirs, self._certs_dirs = ca_file, ca_dirs, certs_dirs
        self._common: ssl.SSLContext | None = None
        """Made for the first HTTPS request: loading the CAs costs 1-2 MiB that HTTP never needs."""
        self._by_host: dict[str, tuple[tuple[tuple[str, int], ...], ssl.SSLContext]] = {}

    def for_host(self, host: str) -> ssl.SSLContext:
        """The context for ``host``; ``RegistryCertsInvalid`` when its certs.d directory cannot
        be used (CRI-O refuses such a host too)."""
        certs = host_certs(self._certs_dirs, host)
        if certs.problem:
            raise RegistryCertsInvalid(f"{certs.directory}: {certs.problem}")
        if not certs.files:
            if self._common is None:
                self._common = tls_context(self._ca_file, self._ca_dirs)
            return self._common
        stamp = tuple((str(path), _checked_size(certs, path)) for path in certs.files)
        known = self._by_host.get(host)
        if known is not None and known[0] == stamp:
            return known[1]
        context = _host_context(tls_context(self._ca_file, self._ca_dirs), certs)
        self._by_host[host] = (stamp, context)
        return context


def _checked_size(certs: HostCerts, path: Path) -> int:
    """``path``'s change time (for the cache), after checking it can be read within bounds."""
    try:
        info = path.stat()
    except OSError as err:
        raise RegistryCertsInvalid(
            f"{certs.directory}: cannot read {path.name}: {err.strerror}"
        ) from err
    if info.st_size > MAX_CERTS_FILE_BYTES:
        raise RegistryCertsInvalid(
            f"{certs.directory}: {path.name} is {info.st_size} bytes, more than the "
            f"{MAX_CERTS_FILE_BYTES} nodeagent reads"
        )
    return info.st_mtime_ns


def _host_context(context: ssl.SSLContext, certs: HostCerts) -> ssl.SSLContext:
    path = certs.directory or Path()
    try:
        for path in certs.cas:
            with path.open("rb") as stream:
                pem = stream.read(MAX_CERTS_FILE_BYTES + 1)
            context.load_verify_locations(cadata=pem.decode("ascii"))
        if certs.pair is not None:
            path = certs.pair[0]
            context.load_cert_chain(*certs.pair, password=_no_password)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError; bad text a ValueError
        raise RegistryCertsInvalid(
            f"{certs.directory}: {path.name} cannot be used: {clip(str(err), 200)} (a CA "
            "must be PEM in *.crt, a client certificate PEM in *.cert with an unencrypted "
            "key of the same name in *.key)"
        ) from err
    return context
