"""Attack: a ``Range`` header of thousands of digits sent to the loopback mirror.

Issue 24, finding 6. ``parse_range`` converted the positions with ``int()``, which raises
``ValueError`` beyond 4,300 digits: a 500 and a traceback in the journal for every such
request, from any local process (the mirror listens on 127.0.0.1) or any certificate holder
(the peer server serves blobs with the same code, ``adapters.http.content``). Each request
here goes to the real ``BundleServer`` over its own socket; each must end in a clean 200
(the range ignored, RFC 9110 section 14.2) or 416, with nothing logged at error level, no
traceback, and the server still serving. Every value stays under the listener's 8 KiB
header line (``listener.MAX_LINE_BYTES``); a longer line is aiohttp's 400 before any handler,
which the last test sends: one journal line for it, never a traceback.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog.testing

from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.adapters.http.peer import PeerServer
from nodeagent.bundles.mirror import served_blobs
from tests.integration.adapters.http import test_peer as peer_tests
from tests.integration.adapters.http.test_peer import Pki, fetch, largest_layer
from tests.testenv.images import BuiltImage, LayerSpec, TestImage
from tests.testenv.oci_layout import OciLayout, write_oci_layout
from tests.testenv.signed_bundles import Signed

# The peer server over a real store and mutual TLS, as tests/integration/adapters/http sets it up.
pki, bundle, server = peer_tests.pki, peer_tests.bundle, peer_tests.server

HOSTILE_RANGES = [
    "bytes=" + "1" * 5000 + "-",
    "bytes=0-" + "9" * 5000,
    "bytes=-" + "7" * 5000,
    "bytes=" + "0" * 4999 + "1-2",
    "bytes=" + "5" * 4000 + "-" + "6" * 4000,
    "bytes=99999999999999999999-",  # 20 digits: past any blob
    "bytes=0-1," * 500 + "0-1",
]


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[tuple[BundleServer, OciLayout]]:
    app = TestImage("factory/app", [LayerSpec(64 * 1024, seed=81)]).build()
    layout = write_oci_layout(tmp_path / "bundle", "registry.factory.invalid:5000", [app])
    async with BundleServer(layout.root, served_blobs(layout.manifest)) as server:
        yield server, layout


def get(port: int, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_a_range_of_thousands_of_digits_is_ignored_or_416_never_a_500(
    mirror: tuple[BundleServer, OciLayout], caplog: pytest.LogCaptureFixture
) -> None:
    server, layout = mirror
    app = layout.images[0]
    assert isinstance(app, BuiltImage)
    layer = app.layers[0]
    data = layer.path.read_bytes()
    path = f"/v2/factory/app/blobs/{layer.digest}"
    stray: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: stray.append(context))
    with caplog.at_level(logging.DEBUG):
        for value in HOSTILE_RANGES:
            status, body = await asyncio.to_thread(get, server.port, path, {"Range": value})
            assert status in (200, 416), value[:40]
            if status == 200:
                assert body == data  # the range ignored: the whole blob
        status, body = await asyncio.to_thread(get, server.port, path, {"Range": "bytes=2-5"})
        assert (status, body) == (206, data[2:6])  # and a real range still works
    await server.settled()
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert logged == []
    assert stray == []


async def test_the_peer_server_answers_the_same_ranges_to_a_certificate_holder(
    server: PeerServer, pki: Pki, bundle: Signed, caplog: pytest.LogCaptureFixture
) -> None:
    """The peer server sends blobs with the same code: the same answers over mutual TLS."""
    context = pki.client_context(pki.ca.client("node-1"))
    digest = largest_layer(bundle)
    path = f"/v2/any/name/blobs/{digest}"
    size = bundle.manifest.blobs[digest].size_bytes
    with caplog.at_level(logging.DEBUG):
        for value in HOSTILE_RANGES:
            status, _, body = await asyncio.to_thread(
                fetch, server.port, context, "GET", path, Range=value
            )
            assert status in (200, 416), value[:40]
            assert len(body) == size or status == 416
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert logged == []


def send_raw(port: int, head: bytes) -> bytes:
    """One request head as given, on its own connection; the answer's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head)
        answer = b""
        while b"\r\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


HOSTILE_HEADS = [
    b"GET /v2/ HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * (16 << 10) + b"\r\n\r\n",
    b"GET /v2/" + b"b" * (16 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v2/ HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n",
    b"GET /v2/ HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
]
"""Heads aiohttp refuses before any handler: a header line and a request line over the 8 KiB
line bound, 200 header fields (the bound is 64), a Content-Length of 5,000 digits."""


async def test_a_malformed_head_is_a_400_and_one_line_never_a_traceback(
    mirror: tuple[BundleServer, OciLayout], capfd: pytest.CaptureFixture[str]
) -> None:
    """aiohttp reports a head it cannot parse to its logger: with none configured, Python's
    last-resort handler wrote "Error handling request" and a whole traceback to stderr (the
    journal) for every such request. Now one ``http_request_failed`` line per client a minute."""
    server, _ = mirror
    with structlog.testing.capture_logs() as events:
        for _ in range(3):
            for head in HOSTILE_HEADS:
                status = await asyncio.to_thread(send_raw, server.port, head)
                assert status.split(b" ")[1:2] == [b"400"], status
        code, _ = await asyncio.to_thread(get, server.port, "/v2/", {})
        assert code == 200  # and the server still serves
    failed = [e for e in events if e["event"] == "http_request_failed"]
    assert len(failed) == 1, failed  # 12 refused heads from one address: one line
    assert failed[0]["address"] == "127.0.0.1"
    assert failed[0]["error"]  # the error's type, e.g. LineTooLong
    stderr = capfd.readouterr().err
    assert "Traceback" not in stderr
    assert "Error handling request" not in stderr
