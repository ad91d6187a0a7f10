"""TLS handshakes the listener refuses, each told once a minute per peer in plain words.

asyncio reports a failed server-side handshake only in debug mode; a node whose peers are
refused (a client certificate from another CA, an expired one, none at all) would show
nothing. ``HandshakeWatch`` wraps each accepted connection in asyncio's own TLS protocol
with a waiter of ours, so the outcome of every handshake is seen: a refusal is logged as
``peer_refused address=10.0.0.7 reason="certificate not signed by the site CA"``, at most
once per peer address per ``QUIET_S`` (the line after a quiet period counts the refusals
not logged in it). ``refusal_reason`` turns OpenSSL's error into those words.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Final

import structlog

from nodeagent.strict import clip

log = structlog.get_logger(__name__)

QUIET_S: Final = 60.0
"""At most one ``peer_refused`` line per peer address in this long."""
MAX_TRACKED: Final = 4096
"""Peer addresses remembered for the rate limit (older ones forgotten first)."""

_VERIFY_REASONS: Final = {
    2: "certificate not signed by the site CA",  # unable to get issuer certificate
    9: "certificate not valid yet (check the clocks)",
    10: "certificate expired",
    18: "self-signed certificate, not signed by the site CA",
    19: "certificate chain ends in a CA other than the site CA",
    20: "certificate not signed by the site CA",  # unable to get local issuer certificate
    21: "certificate not signed by the site CA",  # unable to verify the first certificate
    26: "certificate not meant for TLS clients (wrong key usage)",
    28: "certificate not meant for TLS clients (wrong purpose)",
}
_OPENSSL_REASONS: Final = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate sent",
    "CERTIFICATE_REQUIRED": "no client certificate sent",
    "HTTP_REQUEST": "plain HTTP sent to the HTTPS port",
    "WRONG_VERSION_NUMBER": "not TLS, or a TLS version this node does not speak",
    "UNSUPPORTED_PROTOCOL": "TLS version too old",
    "NO_PROTOCOLS_AVAILABLE": "TLS version too old",
    "NO_SHARED_CIPHER": "no cipher in common",
    "TLSV1_ALERT_UNKNOWN_CA": "the peer does not trust this node's certificate (another CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer refused this node's certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the peer says this node's certificate expired",
    "TLSV1_ALERT_DECRYPT_ERROR": "the peer's certificate does not match its key",
}


def refusal_reason(exc: BaseException | None, handshake_s: float | None) -> str:
    """What went wrong in a handshake, for a technician."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        return _VERIFY_REASONS.get(code, f"certificate refused: {clip(exc.verify_message, 120)}")
    if isinstance(exc, ssl.SSLError) and exc.reason in _OPENSSL_REASONS:
        return _OPENSSL_REASONS[exc.reason]
    if isinstance(exc, TimeoutError) or (
        isinstance(exc, ConnectionAbortedError) and "handshake" in str(exc)
    ):
        limit = "" if handshake_s is None else f" within {handshake_s:g} s"
        return f"handshake not finished{limit}"
    if exc is None or isinstance(exc, ConnectionError | EOFError):
        return "connection closed during the handshake"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {clip(exc.reason or str(exc), 120)}"
    return f"TLS handshake failed: {clip(str(exc) or type(exc).__name__, 120)}"


class RefusalLog:
    """One line per peer address per ``quiet_s``; the refusals in between are counted."""

    def __init__(self, clock: Callable[[], float], quiet_s: float = QUIET_S) -> None:
        self._clock, self._quiet_s = clock, quiet_s
        self._last: dict[str, tuple[float, int]] = {}
        """address → (when it was last logged, refusals not logged since)."""

    def refused(self, address: str, reason: str) -> bool:
        """Log the refusal unless this address was logged less than ``quiet_s`` ago."""
        now = self._clock()
        last = self._last.get(address)
        if last is not None and now - last[0] < self._quiet_s:
            self._last[address] = (last[0], last[1] + 1)
            return False
        if last is None and len(self._last) >= MAX_TRACKED:
            del self._last[next(iter(self._last))]
        self._last.pop(address, None)
        self._last[address] = (now, 0)
        unlogged = {"not_logged_since": last[1]} if last is not None and last[1] else {}
        log.warning("peer_refused", address=address, reason=reason, **unlogged)
        return True


READ_BUFFER_BYTES: Final = 16 << 10
"""The read buffer of each TLS connection. asyncio's default is 256 KiB, allocated (and
touched) when the protocol is built: a server that mostly sends and reads request heads
needs far less (a TLS record is at most 16 KiB). docs/decisions/0052."""


class _Watched(sslproto.SSLProtocol):
    """asyncio's server-side TLS protocol, remembering the peer's address."""

    address = "?"
    max_size = READ_BUFFER_BYTES

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.address = clip(str(peer[0]), 64) if isinstance(peer, tuple) and peer else "?"
        super().connection_made(transport)


class HandshakeWatch:
    """A protocol factory (the listener calls it for each admitted connection): TLS on each
    connection as asyncio does it, bounded by ``handshake_s`` from the moment it is built,
    every failed handshake given to ``RefusalLog``."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        context: ssl.SSLContext,
        *,
        handshake_s: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._loop, self._factory = loop, factory
        self._context, self._handshake_s = context, handshake_s
        self.refusals = RefusalLog(loop.time)
        self.built = 0
        """TLS protocols built (one per admitted connection, none for a refused one)."""

    def __call__(self, on_done: Callable[[], bool] | None = None) -> asyncio.BaseProtocol:
        """A TLS protocol for one connection; ``on_done`` is called when its handshake ends
        (done, failed, cut) and says whether a failure is already accounted for (a
        connection the listener closed itself), so not logged."""
        self.built += 1
        waiter = self._loop.create_future()
        protocol = _Watched(
            self._loop,
            self._factory(),
            self._context,
            waiter,
            server_side=True,
            ssl_handshake_timeout=self._handshake_s,  # type: ignore[arg-type]  # seconds, a float
        )
        waiter.add_done_callback(lambda done: self._done(protocol, done, on_done))
        return protocol

    def _done(
        self,
        protocol: _Watched,
        waiter: asyncio.Future[None],
        on_done: Callable[[], bool] | None,
    ) -> None:
        is_accounted = on_done() if on_done is not None else False
        if waiter.cancelled() or is_accounted:
            return
        exc = waiter.exception()
        if exc is not None:
            self.refusals.refused(protocol.address, refusal_reason(exc, self._handshake_s))
