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
