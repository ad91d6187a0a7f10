"""The listener's admission over real sockets (loopback), plain HTTP as the bundle mirror serves.

The peer server under a flood is tests/security/test_peer_flood.py. Here: on the plain side
(the bundle mirror's), a connection over a cap or outside the allowed networks is closed
before any byte is read, and an admitted one is served and gives its place back when it
ends; on the TLS side, a full server pushes out the oldest connection still in its
handshake, never one that finished it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse
from structlog.testing import capture_logs

from nodeagent.adapters.http.admission import Caps, parse_networks
from nodeagent.adapters.http.listener import Listener
from tests.testenv.pki import Authority
from tests.testenv.waiting import wait_for_async

WAIT_S = 5.0


async def _hello(_request: BaseRequest) -> StreamResponse:
    return Response(body=b"hello")


async def _connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _is_closed_at_once(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(WAIT_S):
        try:
            return await reader.read(1) == b""
        except ConnectionError:
            return True


def _is_open(listener: Listener, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return listener.door.open == count

    return check


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    async with asyncio.timeout(WAIT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        return head.split(b"\r\n", 1)[0] + b" " + await reader.readexactly(5)


async def test_connections_over_the_caps_are_closed_and_the_admitted_ones_served() -> None:
    listener = Listener(_hello, io_timeout_s=10, caps=Caps(3, 2), name="mirror")
    await listener.start("127.0.0.1", 0)
    opened: list[asyncio.StreamWriter] = []
    try:
        with capture_logs() as logs:
            a1, a2, a3 = [await _connect(listener.port, "127.0.0.1") for _ in range(3)]
            b1, b2 = [await _connect(listener.port, "127.0.0.2") for _ in range(2)]
            opened += [w for _, w in (a1, a2, a3, b1, b2)]
            assert await _is_closed_at_once(a3[0])  # third from one address
            assert await _is_closed_at_once(b2[0])  # fourth in all
            assert await _get(*a1) == b"HTTP/1.1 200 OK hello"
            assert await _get(*b1) == b"HTTP/1.1 200 OK hello"
            assert listener.door.open == 3
            a1[1].close()
            await wait_for_async(_is_open(listener, 2), timeout_s=WAIT_S, what="the release")
            again = await _connect(listener.port, "127.0.0.1")
            opened.append(again[1])
            assert await _get(*again) == b"HTTP/1.1 200 OK hello"
        events = [e["event"] for e in logs]
        assert events == [
            "connections_refused",  # 127.0.0.1's third
            "connections_capped",  # the fourth in all
            "connections_accepted_again",  # 127.0.0.1 once one of its own ended
            "connections_uncapped",
        ]
        assert listener.door.refused == {"source-full": 1, "server-full": 1}
        assert listener.tls_built == 0
    finally:
        for writer in opened:
            writer.close()
        await listener.close(grace_s=1)


async def test_a_source_outside_the_allowed_networks_is_closed_at_once() -> None:
    caps = Caps(8, 8, parse_networks(("127.0.0.0/30",)))
    listener = Listener(_hello, io_timeout_s=10, caps=caps, name="peer")
    await listener.start("127.0.0.1", 0)
    try:
        inside = await _connect(listener.port, "127.0.0.2")
        outside = await _connect(listener.port, "127.0.0.9")
        assert await _is_closed_at_once(outside[0])
        assert await _get(*inside) == b"HTTP/1.1 200 OK hello"
        assert listener.door.refused == {"not-allowed": 1}
        for _, writer in (inside, outside):
            writer.close()
    finally:
        await listener.close(grace_s=1)


def test_the_loopback_range_is_usable_as_sources() -> None:
    """The tests above and the flood bind 127.0.0.x: Linux routes all of 127/8 to lo."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.9", 0))


def _tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts of one CA, mutual TLS as the peer server has it."""
    ca = Authority("site CA")
    server_file, client_cert, client_key = (tmp_path / n for n in ("s.pem", "c.crt", "c.key"))
    ca.serving("node-0").write_pair(server_file, server_file)
    ca.client("node-1").write_pair(client_cert, client_key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_file, server_file)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(cadata=ca.cert_pem.decode())
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client.load_cert_chain(client_cert, client_key)
    return server, client


async def test_a_full_tls_server_pushes_out_handshakes_never_authenticated_connections(
    tmp_path: Path,
) -> None:
    server_tls, client_tls = _tls_pair(tmp_path)
    listener = Listener(_hello, io_timeout_s=10, caps=Caps(3, 3), name="peer", handshake_s=10)
    await listener.start("127.0.0.1", 0, server_tls)
    port, opened = listener.port, []

    async def honest(source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        pair = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_tls, local_addr=(source, 0)
        )
        opened.append(pair[1])
        assert await _get(*pair) == b"HTTP/1.1 200 OK hello"  # the server's handshake done
        return pair

    async def silent(source: str) -> asyncio.StreamReader:
        reader, writer = await _connect(port, source)
        opened.append(writer)
        return reader

    try:
        a, _ = await honest("127.0.0.2"), await honest("127.0.0.3")
        s1 = await silent("127.0.0.4")
        s2 = await silent("127.0.0.5")  # full: pushes out s1, the oldest in its handshake
        assert await _is_closed_at_once(s1)
        await honest("127.0.0.6")  # pushes out s2
        assert await _is_closed_at_once(s2)
        s3 = await silent("127.0.0.7")  # every connection authenticated: s3 is refused
        assert await _is_closed_at_once(s3)
        assert await _get(*a) == b"HTTP/1.1 200 OK hello"  # never pushed out
        assert (listener.door.open, listener.door.pushed_out) == (3, 2)
        assert listener.door.refused == {"server-full": 1}
        assert listener.tls_built == 5  # s3 got none
    finally:
        for writer in opened:
            writer.close()
        await listener.close(grace_s=1)


def _deadlines_pending(loop: asyncio.AbstractEventLoop) -> int:
    scheduled = getattr(loop, "_scheduled", [])
    return sum(
        1
        for handle in scheduled
        if not handle.cancelled()
        and getattr(handle._callback, "__name__", "") == "_first_request_due"
    )


async def test_a_connection_that_ends_takes_its_first_request_deadline_with_it() -> None:
    """A deadline left behind would hold its connection's objects for ``io_timeout_s``:
    opening and closing connections quickly would pile them up past every cap."""
    listener = Listener(_hello, io_timeout_s=60, caps=Caps(8, 8), name="mirror")
    await listener.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(40):
            _, writer = await _connect(listener.port, "127.0.0.1")
            writer.close()
        await wait_for_async(_is_open(listener, 0), timeout_s=WAIT_S, what="every release")
        assert _deadlines_pending(loop) == 0
        assert listener.door.admitted == 40
    finally:
        await listener.close(grace_s=1)


async def test_closing_the_server_closes_the_connections_still_in_their_handshake(
    tmp_path: Path,
) -> None:
    server_tls, _ = _tls_pair(tmp_path)
    listener = Listener(_hello, io_timeout_s=60, caps=Caps(8, 8), name="peer", handshake_s=60)
    await listener.start("127.0.0.1", 0, server_tls)
    reader, writer = await _connect(listener.port, "127.0.0.1")
    try:
        await wait_for_async(_is_open(listener, 1), timeout_s=WAIT_S, what="the admission")
        await listener.close(grace_s=1)
        assert await _is_closed_at_once(reader)  # not left for its 60 s deadline
        assert listener.door.open == 0
    finally:
        writer.close()
