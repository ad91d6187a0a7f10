"""The kernel's FIPS switch, ``/proc/sys/crypto/fips_enabled`` (docs/runtime-facts.md,
"FIPS"), and the crypto posture built on it (``nodeagent.fips``)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from nodeagent.adapters.files import read_text_or_none
from nodeagent.errors import HostFileError
from nodeagent.fips import CryptoPosture, not_checked, probe

FIPS_ENABLED_FILE: Final = Path("/proc/sys/crypto/fips_enabled")
MAX_FIPS_FILE_CHARS: Final = 16


def read_host_fips(path: Path = FIPS_ENABLED_FILE) -> bool | None:
    """True when the kernel says 1, False for 0; None when the file is absent, unreadable or
    says anything else (unknown is never taken for off)."""
    try:
        text = read_text_or_none(path)
    except HostFileError:
        return None
    if text is None or len(text) > MAX_FIPS_FILE_CHARS:
        return None
    return {"1": True, "0": False}.get(text.strip())


def read_posture(*, always_probe: bool, path: Path = FIPS_ENABLED_FILE) -> CryptoPosture:
    """The posture; the backend is loaded and tested when ``always_probe`` (check-config) or
    when the host is in FIPS mode (the daemon: an idle node not in FIPS mode, or whose kernel
    has no FIPS switch, does not load it; decision 0069's idle budget)."""
    host_fips = read_host_fips(path)
    if always_probe or host_fips is True:
        return probe(host_fips)
    return not_checked(host_fips)
