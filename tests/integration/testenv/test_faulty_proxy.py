"""The fault drills' proxy in front of the real registry does each fault, and nothing else.

``tests/testenv/faulty_proxy.py``: pass-through byte for byte, 500 to N requests or for a
while (to nodeagent's User-Agent only, if asked), connections refused and served again on
the same port, a body stalled after N bytes, a rate limit; every request recorded.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Pushed
from tests.testenv.faulty_proxy import FaultyProxy, Request, is_blob
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(registry: Registry) -> Iterator[FaultyProxy]:
    with FaultyProxy(registry.host) as running:
        yield running


def get(
    host: str, path: str, *, user_agent: str = "test", timeout_s: float = 10
) -> tuple[int, bytes]:
    address, port = host.rsplit(":", 1)
    conn = http.client.HTTPConnection(address, int(port), timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"User-Agent": user_agent})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def blob_path(pushed: Pushed) -> str:
    return f"/v2/{pushed.base_a.repository}/blobs/{pushed.base_a.layer_digests[0]}"


def test_passes_answers_through_byte_for_byte_and_records_them(
    proxy: FaultyProxy, registry: Registry, pushed: Pushed
) -> None:
    path = blob_path(pushed)
    status, body = get(proxy.host, path, user_agent="cri-o/1")
    assert (status, body) == get(registry.host, path)
    exchange = proxy.exchanges()[-1]
    assert exchange.request == Request("GET", path, "cri-o/1")
    assert (exchange.status, exchange.fault, exchange.is_done) == (200, "", True)
    assert exchange.body_bytes == len(body) > 0
    assert proxy.blob_fetches() == {pushed.base_a.layer_digests[0]: 1}


def test_answers_500_to_the_next_n_requests_then_passes(proxy: FaultyProxy) -> None:
    proxy.answer_errors(500, count=2)
    assert [get(proxy.host, "/v2/")[0] for _ in range(3)] == [500, 500, 200]
    assert [e.fault for e in proxy.exchanges()] == ["error", "error", ""]


def test_answers_500_for_a_while_and_only_to_the_requests_matched(proxy: FaultyProxy) -> None:
    proxy.answer_errors(503, for_s=1.0, match=lambda r: r.is_from_nodeagent)
    assert get(proxy.host, "/v2/", user_agent="nodeagent/1.0")[0] == 503
    assert get(proxy.host, "/v2/", user_agent="cri-o/1.34.0")[0] == 200
    time.sleep(1.1)
    assert get(proxy.host, "/v2/", user_agent="nodeagent/1.0")[0] == 200


def test_error_answers_carry_the_headers_given(proxy: FaultyProxy) -> None:
    challenge = "Bearer " + "a" * 60_000
    proxy.answer_errors(401, headers={"WWW-Authenticate": challenge})
    address, port = proxy.host.rsplit(":", 1)
    conn = http.client.HTTPConnection(address, int(port), timeout=10)
    try:
        conn.request("GET", "/v2/")
        response = conn.getresponse()
        assert (response.status, response.getheader("WWW-Authenticate")) == (401, challenge)
    finally:
        conn.close()


def test_refuses_connections_then_serves_again_on_the_same_port(proxy: FaultyProxy) -> None:
    proxy.refuse()
    with pytest.raises(ConnectionRefusedError):
        get(proxy.host, "/v2/")
    proxy.serve()
    assert get(proxy.host, "/v2/")[0] == 200


def test_stalls_a_body_after_n_bytes_until_healed(proxy: FaultyProxy, pushed: Pushed) -> None:
    proxy.stall_bodies(after_bytes=1000, match=is_blob)
    address, port = proxy.host.rsplit(":", 1)
    conn = http.client.HTTPConnection(address, int(port), timeout=1.0)
    conn.request("GET", blob_path(pushed))
    response = conn.getresponse()
    assert response.status == 200
    assert len(response.read(1000)) == 1000
    with pytest.raises(TimeoutError):
        response.read(1)
    response.close()  # its own file object holds the socket too
    conn.close()
    assert proxy.exchanges()[-1].fault == "stall"
    proxy.heal()
    assert get(proxy.host, blob_path(pushed))[0] == 200


def test_limits_the_rate_of_bodies(proxy: FaultyProxy, pushed: Pushed) -> None:
    proxy.throttle(1 << 20)  # 1 MiB/s
    started = time.monotonic()
    status, body = get(proxy.host, blob_path(pushed))
    assert status == 200
    assert time.monotonic() - started >= len(body) / (1 << 20) * 0.9


def test_closes_a_tls_handshake_without_recording_it(proxy: FaultyProxy) -> None:
    address, port = proxy.host.rsplit(":", 1)
    with socket.create_connection((address, int(port)), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03")
        assert sock.recv(100) == b""
    assert proxy.exchanges() == []
