"""systemd socket activation of the node mirror, the pure part (decision 0063).

``nodeagent-mirror.socket`` holds ``[mirror] listen`` from boot (sockets.target), so no
other local process can bind the port while the mirror process is not running, and starts
``nodeagent-mirror.service`` on the first connection, passing the listening socket by the
sd_listen_fds protocol (sd_listen_fds(3)): ``LISTEN_PID`` is the pid of the process the
sockets are meant for, ``LISTEN_FDS`` how many, passed as the descriptors from 3 on.

Here: what the environment says (``passed_fds``), and whether the socket passed is the one
the configuration names (``socket_problem``): a listening TCP stream socket bound to
exactly ``[mirror] listen``. Anything else is refused with a sentence for the journal: a
socket unit edited to another address would serve a port the registries.conf drop-in does
not name (or name a port the mirror does not serve).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from nodeagent.config.addresses import Address

LISTEN_FDS_START: Final = 3
"""The first descriptor systemd passes (``SD_LISTEN_FDS_START``)."""
MAX_LISTEN_FDS: Final = 64
"""More than the socket unit could pass: a larger count is malformed, not a loop bound."""
_DIGITS_MAX: Final = 10


@dataclass(frozen=True, slots=True)
class Passed:
    """The descriptors passed (``count`` from ``LISTEN_FDS_START``), or why none are usable."""

    count: int
    problem: str = ""


def _number(text: str) -> int | None:
    if not text or len(text) > _DIGITS_MAX or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def passed_fds(environ: Mapping[str, str], pid: int) -> Passed:
    """What ``LISTEN_PID``/``LISTEN_FDS`` in ``environ`` say for the process ``pid``.

    No ``LISTEN_FDS``: none passed (a manual run, a test: the mirror binds itself). A
    ``LISTEN_PID`` of another process: none passed to this one (sd_listen_fds(3): the
    variables were inherited). Malformed values are a problem, never a guess."""
    fds_text, pid_text = environ.get("LISTEN_FDS", ""), environ.get("LISTEN_PID", "")
    if not fds_text and not pid_text:
        return Passed(0)
    owner = _number(pid_text)
    if owner is None:
        return Passed(0, "LISTEN_PID is not a process id")
    if owner != pid:
        return Passed(0)
    count = _number(fds_text)
    if count is None or count > MAX_LISTEN_FDS:
        return Passed(0, "LISTEN_FDS is not a count of descriptors")
    if count != 1:
        return Passed(count, f"{count} sockets were passed; the node mirror takes exactly one")
    return Passed(1)


@dataclass(frozen=True, slots=True)
class SocketFacts:
    """What the kernel says of a passed descriptor (read by the adapter)."""

    is_inet: bool
    """``AF_INET`` or ``AF_INET6``."""
    is_stream: bool
    is_listening: bool
    """``SO_ACCEPTCONN``."""
    host: str
    """``getsockname()``'s address (an IPv6 one without brackets)."""
    port: int


def _same_host(bound: str, wanted: str) -> bool:
    try:
        found = ipaddress.ip_address(bound)
        expected = ipaddress.ip_address(wanted)
    except ValueError:
        return False
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        found = found.ipv4_mapped
    return found == expected


def socket_problem(facts: SocketFacts, wanted: Address) -> str:
    """Why the passed socket is not the node mirror's (empty when it is)."""
    if not facts.is_inet or not facts.is_stream:
        return "the socket passed is not a TCP socket"
    if not facts.is_listening:
        return "the socket passed is not listening"
    if facts.port != wanted.port or not _same_host(facts.host, wanted.host):
        bound = Address(facts.host, facts.port)
        return f"the socket passed listens on {bound}, [mirror] listen is {wanted}"
    return ""
