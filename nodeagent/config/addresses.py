"""``host:port`` addresses of the site's peers and of the peer server, checked strictly.

A host is an IPv4 address, an IPv6 address in brackets (``[fd00::1]:9447``) or a DNS name
(at most 253 characters, lowercase or not); the port is 1 to 65535 and must be given.
Nothing here resolves a name.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final, NamedTuple

MAX_ADDRESS_CHARS: Final = 300
_DNS_NAME = re.compile(
    r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*"
)
_PORT = re.compile(r"[0-9]{1,5}")


class Address(NamedTuple):
    """A checked ``host:port``; ``host`` without brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url_host(self) -> str:
        """The host as a URL's authority writes it (IPv6 in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_address(text: str) -> Address:
    """``text`` as an ``Address``; ``ValueError`` (without the text) when it is not one."""
    if len(text) > MAX_ADDRESS_CHARS:
        raise ValueError("too long")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError("an IPv6 address needs the form [address]:port")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("not an IPv6 address in brackets") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError("the port is missing")
        if not _is_host(host):
            raise ValueError("not an IPv4 address or a DNS name")
    if _PORT.fullmatch(port) is None or not 1 <= int(port) <= 65535:
        raise ValueError("the port must be a number from 1 to 65535")
    return Address(host, int(port))


def _is_host(host: str) -> bool:
    if len(host) > 253 or _DNS_NAME.fullmatch(host) is None:
        return False
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        # all-digit labels that are not an address (e.g. 10.0.0.256) are refused too
        return not all(label.isdigit() for label in host.split("."))
    return True


def is_address(text: str) -> bool:
    try:
        parse_address(text)
    except ValueError:
        return False
    return True
