"""Which accepted connections the listener keeps: caps in total and per source address.

Pure (no I/O; it logs its transitions): the listener asks ``Door.admit`` when the kernel
hands it a connection, before any TLS or HTTP object is built for it, and calls
``Door.release`` when an admitted connection ends. A connection refused is closed at once by
the caller; nothing of it is kept but a count. docs/site.md, "Connections";
docs/decisions/0052-peer-connection-limits.md.

Checked in this order, the first that fails is the refusal:

* ``not-allowed``: the source is outside ``Caps.allow_from`` (empty: any source);
* ``source-full``: the source already holds ``Caps.max_per_source`` connections;
* ``server-full``: the server already holds ``Caps.max_connections``, and the caller
  could not make room (the listener pushes out the oldest connection still in its TLS
  handshake, ``nodeagent.adapters.http.gate``).

Journal, once per transition, never per connection: ``connections_refused`` (warning) the
first time a source is refused (not-allowed, source-full), ``connections_accepted_again``
(info, with the count) when it is next admitted; ``connections_capped`` (warning) when the
total cap first refuses one or pushes one out, ``connections_uncapped`` (info, with both
counts) at the next admission that found room. A refusal because the server is full is not
logged per source: many sources would mean many lines.
"""

from __future__ import annotations

import ipaddress
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import structlog

from nodeagent.strict import clip

log = structlog.get_logger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Refusal = Literal["not-allowed", "source-full", "server-full"]
UNKNOWN: Final = "?"
"""The source of a connection whose peer address is not known (never allowed by a list)."""
MAX_TRACKED: Final = 4096
"""Sources remembered as refused (older ones forgotten first: each is logged again)."""


@dataclass(frozen=True, slots=True)
class Caps:
    """What one listener keeps open at once."""

    max_connections: int
    """Open connections in total (handshakes in progress included)."""
    max_per_source: int
    """Open connections from one source address."""
    allow_from: tuple[Network, ...] = ()
    """Source networks admitted; empty: any."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_per_source <= self.max_connections:
            raise ValueError("caps need 1 <= max_per_source <= max_connections")


def source_of(peername: object) -> str:
    """The source address of ``transport.get_extra_info("peername")``, as the caps count it.

    An IPv4 peer on a dual-stack socket (``::ffff:10.0.0.7``) counts as ``10.0.0.7``, so one
    peer has one budget whichever way it came in.
    """
    if not isinstance(peername, tuple) or not peername or not isinstance(peername[0], str):
        return UNKNOWN
    try:
        address = ipaddress.ip_address(peername[0])
    except ValueError:
        return UNKNOWN
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def is_allowed(source: str, networks: tuple[Network, ...]) -> bool:
    """Whether ``source`` (from ``source_of``) is in one of ``networks`` (empty: any)."""
    if not networks:
        return True
    if source == UNKNOWN:
        return False
    address = ipaddress.ip_address(source)
    return any(address in network for network in networks)


def parse_networks(texts: tuple[str, ...]) -> tuple[Network, ...]:
    """``["10.0.0.0/24", "fd00::/64"]`` as networks; ValueError names a bad one (clipped)."""
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError:
            raise ValueError(f"not a network such as 10.0.0.0/24: {clip(text, 64)}") from None
    return tuple(networks)


_WORDS: Final[dict[Refusal, str]] = {
    "not-allowed": "address not in the allowed networks ([site] allow_from)",
    "source-full": "too many connections at once from this address",
    "server-full": "too many connections at once",
}


class Door:
    """Counts the open connections of one listener (``server`` names it in the journal)."""

    def __init__(self, caps: Caps, *, server: str) -> None:
        self.caps, self._server = caps, server
        self._open: Counter[str] = Counter()
        self.refused: Counter[Refusal] = Counter()
        """Connections refused since start, by reason."""
        self.admitted = 0
        """Connections admitted since start."""
        self._refusing: OrderedDict[str, int] = OrderedDict()
        """Sources refused since their last admission → refusals not logged."""
        self.pushed_out = 0
        """Connections closed to make room for a newcomer (``admit``'s ``room``)."""
        self._capped: tuple[int, int] | None = None
        """Since the total cap was reached: (refused, pushed out); None: not reached."""

    @property
    def open(self) -> int:
        return self._open.total()

    def open_from(self, source: str) -> int:
        return self._open[source]

    def admit(self, source: str, *, room: Callable[[], bool] | None = None) -> Refusal | None:
        """Admit a connection from ``source`` (counted open) or say why not (nothing kept).

        ``room``: when the server is full, called to close an open connection that may be
        pushed out (it gives its place back first); True when it did.
        """
        refusal = self._judge(source)
        is_pushing = refusal == "server-full" and room is not None and room()
        if is_pushing:
            self.pushed_out += 1
            refusal = self._judge(source)
        if refusal is not None:
            self.refused[refusal] += 1
            self._note_refused(source, refusal)
            return refusal
        self._open[source] += 1
        self.admitted += 1
        if is_pushing:
            self._note_capped(refusal=False)
        self._note_admitted(source, is_pushing=is_pushing)
        return None

    def release(self, source: str) -> None:
        """An admitted connection from ``source`` ended."""
        if self._open[source] <= 0:
            raise ValueError("no connection of this source is open")
        self._open[source] -= 1
        if not self._open[source]:
            del self._open[source]

    def _judge(self, source: str) -> Refusal | None:
        if not is_allowed(source, self.caps.allow_from):
            return "not-allowed"
        if self._open[source] >= self.caps.max_per_source:
            return "source-full"
        if self.open >= self.caps.max_connections:
            return "server-full"
        return None

    def _note_capped(self, *, refusal: bool) -> None:
        if self._capped is None:
            self._capped = (0, 0)
            log.warning(
                "connections_capped",
                server=self._server,
                open=self.open,
                max_connections=self.caps.max_connections,
                reason=_WORDS["server-full"],
            )
        refused, pushed = self._capped
        self._capped = (refused + 1, pushed) if refusal else (refused, pushed + 1)

    def _note_refused(self, source: str, refusal: Refusal) -> None:
        if refusal == "server-full":
            self._note_capped(refusal=True)
            return
        if source in self._refusing:
            self._refusing[source] += 1
            return
        if len(self._refusing) >= MAX_TRACKED:
            self._refusing.popitem(last=False)
        self._refusing[source] = 1
        log.warning(
            "connections_refused",
            server=self._server,
            address=clip(source, 64),
            reason=_WORDS[refusal],
            open_from_address=self._open[source],
            max_per_source=self.caps.max_per_source,
        )

    def _note_admitted(self, source: str, *, is_pushing: bool) -> None:
        refused = self._refusing.pop(source, None)
        if refused is not None:
            log.info(
                "connections_accepted_again",
                server=self._server,
                address=clip(source, 64),
                refused=refused,
            )
        if self._capped is not None and not is_pushing:
            refused, pushed = self._capped
            log.info(
                "connections_uncapped", server=self._server, refused=refused, pushed_out=pushed
            )
            self._capped = None
