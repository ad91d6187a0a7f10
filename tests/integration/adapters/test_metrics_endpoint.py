"""The metrics endpoint (``adapters.metrics``) on a real loopback socket: it answers while a sync
holds its locks (a scrape never waits on a sync), in the format the scraper asks for, refuses
what is not a scrape with the status that says why, and a port already taken is
``MetricsListenFailed``."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import urllib.request

import pytest

from nodeagent.adapters import metrics
from nodeagent.adapters.metrics import MAX_CONNECTIONS, MetricsEndpoint
from nodeagent.errors import MetricsListenFailed
from nodeagent.metrics.recorder import Recorder
from nodeagent.metrics.series import Transfer

pytestmark = pytest.mark.integration


def get(port: int, accept: str) -> tuple[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310  (loopback http)
        return answer.headers["Content-Type"], answer.read().decode()


async def test_a_scrape_is_answered_while_a_sync_holds_its_locks() -> None:
    recorder = Recorder()
    recorder.transferred(Transfer.PULLED, 1234)
    held = asyncio.Lock()  # as a sync holds its locks across its awaits
    async with MetricsEndpoint(recorder, host="127.0.0.1", port=0) as endpoint, held:
        content_type, text = await asyncio.to_thread(get, endpoint.bound_port, "text/plain")
    assert content_type.startswith("text/plain")
    assert 'nodeagent_transferred_bytes_total{kind="pulled"} 1234.0' in text


async def exchange(port: int, request: bytes) -> bytes:
    """Everything the endpoint answers to ``request`` until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer


async def test_gzip_when_the_scraper_accepts_it_and_head_without_a_body() -> None:
    recorder = Recorder()
    recorder.transferred(Transfer.PULLED, 99)
    async with MetricsEndpoint(recorder, host="127.0.0.1", port=0) as endpoint:
        zipped = await exchange(
            endpoint.bound_port,
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n\r\n",
        )
        head_only = await exchange(endpoint.bound_port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    head, _, body = zipped.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Encoding: gzip" in head
    assert b'nodeagent_transferred_bytes_total{kind="pulled"} 99.0' in gzip.decompress(body)
    assert f"Content-Length: {len(body)}".encode() in head
    status, _, rest = head_only.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK"
    assert rest.endswith(b"\r\n\r\n")  # the length of the body, not the body
    assert b"Content-Length: 0" not in rest


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /other HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/2.0\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nAccept: a\r\nAccept: b\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX: \xff\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n folded\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", b"431"),
    ],
    ids=["path", "method", "version", "twice", "non-ascii", "folding", "too-large"],
)
async def test_what_is_not_a_scrape_is_refused_with_its_status(
    request_bytes: bytes, status: bytes
) -> None:
    async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=0) as endpoint:
        answer = await exchange(endpoint.bound_port, request_bytes)
    assert answer.split(b" ", 2)[1] == status, answer[:200]
    assert b"\r\nConnection: close\r\n" in answer


async def test_a_silent_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "HEAD_TIMEOUT_S", 0.2)
    async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=0) as endpoint:
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.bound_port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        writer.close()


async def test_connections_beyond_the_cap_are_closed_unanswered() -> None:
    request = b"GET /metrics HTTP/1.1\r\n\r\n"
    async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=0) as endpoint:
        port = endpoint.bound_port
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        assert await refused(port, request)  # the one too many, though it asked
        for _, writer in silent:
            writer.close()
            await writer.wait_closed()
        served = await asyncio.wait_for(_until_served(port, request), timeout=10)
    assert served.startswith(b"HTTP/1.1 200 OK")


async def refused(port: int, request: bytes) -> bool:
    """Closed unanswered: an empty answer, or a reset (closed with the request unread)."""
    try:
        return await exchange(port, request) == b""
    except ConnectionResetError:
        return True


async def _until_served(port: int, request: bytes) -> bytes:
    """The endpoint sees the silent connections' close on its next loop turns (each try
    waits on the network, so the endpoint's handlers run meanwhile)."""
    while True:
        with contextlib.suppress(ConnectionResetError):
            if answer := await exchange(port, request):
                return answer


async def test_a_taken_port_is_metrics_listen_failed_and_says_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsListenFailed) as raised:
            async with MetricsEndpoint(Recorder(), host="127.0.0.1", port=port):
                pass
    assert f"127.0.0.1:{port}" in raised.value.message
    assert "[metrics] listen" in raised.value.message
    assert raised.value.reason == "MetricsListenFailed"
