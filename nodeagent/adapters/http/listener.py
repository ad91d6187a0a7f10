"""The aiohttp low-level server both faces run on: bounded heads, deadlines, graceful close.

``aiohttp.web_server.Server`` with one handler coroutine and no router: the caller routes on
the raw path itself (aiohttp's router would normalize ``..`` and percent escapes first).
Only the low-level modules are imported, never ``aiohttp.web`` with its application,
router, file and websocket machinery: 1.8 MiB less resident (docs/performance.md). Request
heads are bounded by the C parser (``MAX_LINE_BYTES`` per line, ``MAX_HEADERS`` fields);
a malformed head (a TLS ClientHello on the plain-HTTP mirror port, which containers-image
sends before it falls back to HTTP) is answered 400 at once and the connection closed.

Admission (``nodeagent.adapters.http.gate``, ``nodeagent.adapters.http.admission``): each
accepted connection is first given to a gate, which asks the listener's ``Door`` (caps in
total and per source address, an optional allow-list of networks) and closes a refused
connection at once, before any TLS or HTTP object is built for it (a TLS protocol holds a
read buffer; a flood of idle connections would otherwise hold one each). An admitted one
is handed to its protocol and counted until it ends. On a full TLS server a newcomer
pushes out the oldest connection still in its handshake, never one past it.

Deadlines: a TLS handshake must end within ``handshake_s`` of being accepted (a few
seconds: a peer on the site's network needs milliseconds); a connection must send its
first request head within ``io_timeout_s`` of being accepted, or of its handshake; an idle
keep-alive connection is closed after ``io_timeout_s`` (aiohttp's keep-alive timer, which also ends
a next head that trickles in), and the handler bounds its own sends. A TLS handshake
that fails is logged (``peer_refused``, once a minute per peer address, in words:
``nodeagent.adapters.http.handshake``), which asyncio itself does only in debug mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web_protocol, web_server
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from nodeagent.adapters.http.admission import Caps, Door
from nodeagent.adapters.http.gate import Handshaking, PlainGate, TlsGate
from nodeagent.adapters.http.handshake import HandshakeWatch
from nodeagent.adapters.http.request_errors import RequestErrors

MAX_LINE_BYTES: Final = 8 << 10
"""Request line and each header line."""
MAX_HEADERS: Final = 64
"""Header fields in one request head."""
DROP_S: Final = 1.0
"""After the grace period of ``close``: how long cancelling the requests left may take."""

Handler = Callable[[BaseRequest], Awaitable[StreamResponse]]


class _Server(web_server.Server):
    """``web_server.Server`` that closes a connection which sends no request within its deadline."""

    def __init__(self, handler: Handler, *, first_request_s: float, **kwargs: object) -> None:
        super().__init__(self._mark, **kwargs)  # type: ignore[arg-type]
        self._handle, self._first_request_s = handler, first_request_s
        self._waiting: dict[web_protocol.RequestHandler, asyncio.TimerHandle] = {}
        """Connections that have not sent a request yet, and their deadline's timer (ended
        with the connection: a timer outliving it would hold it for ``first_request_s``)."""

    async def _mark(self, request: BaseRequest) -> StreamResponse:
        self._stop_waiting(request.protocol)
        return await self._handle(request)

    def connection_made(
        self, handler: web_protocol.RequestHandler, transport: asyncio.Transport
    ) -> None:
        super().connection_made(handler, transport)
        loop = asyncio.get_running_loop()
        due = loop.call_later(self._first_request_s, self._first_request_due, handler, transport)
        self._waiting[handler] = due

    def _first_request_due(
        self, handler: web_protocol.RequestHandler, transport: asyncio.Transport
    ) -> None:
        if self._waiting.pop(handler, None) is not None:
            transport.abort()

    def _stop_waiting(self, handler: web_protocol.RequestHandler) -> None:
        due = self._waiting.pop(handler, None)
        if due is not None:
            due.cancel()

    def connection_lost(
        self, handler: web_protocol.RequestHandler, exc: BaseException | None = None
    ) -> None:
        self._stop_waiting(handler)
        super().connection_lost(handler, exc)


class Listener:
    """Serves ``handler`` on ``host:port`` (TLS when ``tls`` is given) until closed.

    ``caps``: the connections kept open at once (``name`` says whose in the journal);
    ``handshake_s``: the TLS handshake's deadline. ``settled()`` waits until no request is
    being answered (idle keep-alive connections do not count).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        io_timeout_s: float,
        caps: Caps,
        name: str,
        handshake_s: float = 5.0,
    ) -> None:
        self._handler, self._io_timeout_s = handler, io_timeout_s
        self._handshake_s = handshake_s
        self.door = Door(caps, server=name)
        self.request_errors = RequestErrors(name)
        """aiohttp's reports of requests it could not parse or answer: one line, no traceback."""
        """Open connections and refusals (read by tests and the daemon's counters)."""
        self._web: _Server | None = None
        self._server: asyncio.Server | None = None
        self._watch: HandshakeWatch | None = None
        self._handshaking = Handshaking()
        self._responding = 0
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        """Listen on ``host:port``, or on ``sock``, a listening socket made by another
        (systemd's socket activation: ``host`` and ``port`` are then unused)."""
        self._web = _Server(
            self._answer,
            first_request_s=self._io_timeout_s,
            keepalive_timeout=self._io_timeout_s,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
            lingering_time=0,
            access_log=None,
            logger=self.request_errors,
        )
        loop = asyncio.get_running_loop()
        door, web = self.door, self._web
        factory: Callable[[], asyncio.BaseProtocol]
        if tls is None:
            factory = lambda: PlainGate(door, web)  # noqa: E731
        else:
            watch = HandshakeWatch(web, tls, handshake_s=self._handshake_s)  # each outcome seen
            handshaking = self._handshaking
            self._watch = watch
            factory = lambda: TlsGate(door, watch, handshaking)  # noqa: E731
        if sock is None:
            self._server = await loop.create_server(factory, host, port)
        else:
            self._server = await loop.create_server(factory, sock=sock)

    @property
    def tls_built(self) -> int:
        """TLS protocols built since start: one per admitted connection (0 without TLS)."""
        return 0 if self._watch is None else self._watch.built

    async def settled(self) -> None:
        await self._settled.wait()

    async def close(self, *, grace_s: float) -> None:
        """Stop accepting, let answers in progress end (up to ``grace_s``), drop the rest."""
        if self._server is None or self._web is None:
            return
        self._server.close()
        for _ in range(len(self._handshaking)):  # no request of theirs can be in progress
            self._handshaking.push_out_oldest()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self.settled()
        # Then each connection's request is cancelled, within DROP_S. Not 0: aiohttp reads a
        # timeout of 0 as none at all and would wait for every request to end on its own
        # (a peer's download, up to its I/O timeout), holding the daemon's stop.
        await self._web.shutdown(DROP_S)
        await self._server.wait_closed()
        self._server = self._web = None

    async def _answer(self, request: BaseRequest) -> StreamResponse:
        self._responding += 1
        self._settled.clear()
        try:
            return await self._handler(request)
        finally:
            self._responding -= 1
            if not self._responding:
                self._settled.set()
