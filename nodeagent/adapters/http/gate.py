"""The first protocol of each accepted connection: admitted by the listener's door, or closed.

``loop.create_server`` builds a connection's protocol before anyone knows its peer's
address, so the listener gives it a gate: in ``connection_made`` the gate asks the
``Door`` (``nodeagent.adapters.http.admission``), closes a refused connection at once, and
builds the connection's own protocol (aiohttp's request handler, or asyncio's TLS protocol
through ``HandshakeWatch``) only for an admitted one. It then passes every call on to it
(the transport keeps calling the gate), so it sees the end and gives the place back.

When the server is full, a newcomer may push out the oldest connection still in its TLS
handshake (``Handshaking``): an honest node finishes its handshake in milliseconds, so
connections that send nothing cannot keep it out however many addresses they come from;
a connection whose handshake is done (it holds a certificate of the site CA) is never
pushed out. docs/decisions/0052-peer-connection-limits.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nodeagent.adapters.http.admission import Door, source_of
from nodeagent.adapters.http.handshake import HandshakeWatch


class Gate:
    """Admission, then every protocol call passed on to the protocol ``_build`` makes."""

    def __init__(self, door: Door) -> None:
        self._door = door
        self._inner: asyncio.BaseProtocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._source = ""
        self._is_counted = False
        self.is_pushed_out = False

    def _build(self) -> asyncio.BaseProtocol:
        raise NotImplementedError

    def _room(self) -> bool:
        """Make room for this connection on a full server (none by default)."""
        return False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        source = source_of(transport.get_extra_info("peername"))
        if self._door.admit(source, room=self._room) is not None:
            _close_now(transport)  # no protocol was built for it
            return
        self._source, self._transport, self._is_counted = source, transport, True
        self._inner = self._build()
        self._inner.connection_made(transport)

    def push_out(self) -> None:
        """Close this admitted connection now, its place given back at once."""
        self.is_pushed_out = True
        self._give_back()
        if self._transport is not None:
            _close_now(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._give_back()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def _give_back(self) -> None:
        if self._is_counted:
            self._is_counted = False
            self._door.release(self._source)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def eof_received(self) -> bool | None:
        inner = self._inner
        if isinstance(inner, asyncio.Protocol | asyncio.BufferedProtocol):
            return inner.eof_received()
        return None


def _close_now(transport: asyncio.BaseTransport) -> None:
    if isinstance(transport, asyncio.Transport):
        transport.abort()  # nothing to send: do not wait
    else:
        transport.close()


class PlainGate(Gate, asyncio.Protocol):
    """For plain HTTP (the bundle mirror): ``factory`` is aiohttp's server."""

    def __init__(self, door: Door, factory: Callable[[], asyncio.BaseProtocol]) -> None:
        super().__init__(door)
        self._factory = factory

    def _build(self) -> asyncio.BaseProtocol:
        return self._factory()

    def data_received(self, data: bytes) -> None:
        if isinstance(self._inner, asyncio.Protocol):
            self._inner.data_received(data)


class Handshaking:
    """The admitted TLS connections still in their handshake, oldest first."""

    def __init__(self) -> None:
        self._gates: dict[TlsGate, None] = {}

    def __len__(self) -> int:
        return len(self._gates)

    def add(self, gate: TlsGate) -> None:
        self._gates[gate] = None

    def discard(self, gate: TlsGate) -> None:
        self._gates.pop(gate, None)

    def push_out_oldest(self) -> bool:
        """Close the oldest connection still in its handshake; False when there is none."""
        if not self._gates:
            return False
        oldest = next(iter(self._gates))
        del self._gates[oldest]
        oldest.push_out()
        return True


class TlsGate(Gate, asyncio.BufferedProtocol):
    """For asyncio's TLS protocol, a buffered one: the transport reads into its buffer."""

    def __init__(self, door: Door, watch: HandshakeWatch, handshaking: Handshaking) -> None:
        super().__init__(door)
        self._watch, self._handshaking = watch, handshaking

    def _build(self) -> asyncio.BaseProtocol:
        self._handshaking.add(self)
        return self._watch(on_done=self._handshake_done)

    def _room(self) -> bool:
        return self._handshaking.push_out_oldest()

    def _handshake_done(self) -> bool:
        self._handshaking.discard(self)
        return self.is_pushed_out  # counted by the door (``pushed_out``), not logged

    def connection_lost(self, exc: Exception | None) -> None:
        self._handshaking.discard(self)
        super().connection_lost(exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        inner = self._inner
        if inner is None:
            raise RuntimeError("no connection admitted")
        buffer: memoryview = inner.get_buffer(sizehint)  # type: ignore[attr-defined]
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        if isinstance(self._inner, asyncio.BufferedProtocol):
            self._inner.buffer_updated(nbytes)
