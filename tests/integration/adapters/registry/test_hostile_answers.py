"""RegistryClient against a registry whose answers break the rules (issue 13).

A scripted server on loopback sends exactly the bytes each case needs (a 60 KB challenge,
a token answer with a CR LF in its token, a manifest nested 1000 deep that matches its
digest, too many header fields, a redirect to ``file:``); the client must end each
look-up with a reason-coded error, quickly, and never with another exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.errors import (
    ImageNotFound,
    NodeAgentError,
    RegistryError,
    RegistryUnavailable,
)
from nodeagent.registries import Platform

pytestmark = pytest.mark.integration

Handler = Callable[[str], bytes]
"""Request target (path and query) → the raw answer."""


class ScriptedRegistry:
    """Answers each request on loopback with what ``handler`` returns, then closes."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.targets: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                target = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else ""
                self.targets.append(target)
                try:
                    conn.sendall(self.handler(target))
                except OSError:
                    continue

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
        self._server.close()
        self._thread.join(timeout=5)


def _answer(status: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes) -> bytes:
    fields = headers.items() if isinstance(headers, dict) else headers
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode("latin-1") + body


@pytest.fixture
def scripted() -> Iterator[Callable[[Handler], ScriptedRegistry]]:
    started: list[ScriptedRegistry] = []

    def start(handler: Handler) -> ScriptedRegistry:
        started.append(ScriptedRegistry(handler))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _client(server: ScriptedRegistry) -> RegistryClient:
    return RegistryClient(
        insecure={server.host}, timeout_s=5.0, platform=Platform("linux", "amd64")
    )


DIGEST = "sha256:" + "a" * 64


async def _look_up(server: ScriptedRegistry, digest: str = DIGEST) -> NodeAgentError:
    started = time.monotonic()
    with pytest.raises(NodeAgentError) as caught:
        await _client(server).image_layers(f"{server.host}/app@{digest}")
    assert time.monotonic() - started < 5.0
    assert len(str(caught.value)) < 800
    return caught.value


def _challenged(challenge: str, token_answer: bytes | None = None) -> Handler:
    def handle(target: str) -> bytes:
        if target.startswith("/token"):
            return _answer("200 OK", {"Content-Type": "application/json"}, token_answer or b"")
        return _answer("401 Unauthorized", {"WWW-Authenticate": challenge}, b"")

    return handle


async def test_a_60_kb_challenge_is_refused_at_once(
    scripted: Callable[[Handler], ScriptedRegistry],
) -> None:
    server = scripted(_challenged("Bearer " + "a" * 60_000))
    started = time.process_time()
    error = await _look_up(server)
    assert isinstance(error, RegistryError)
    assert "cannot read" in error.message
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(
    ("token_answer", "message"),
    [
        (json.dumps({"token": "t\r\nX-Evil: 1"}).encode(), "characters a header cannot carry"),
        (b'{"token":"t","expires_in":' + b"9" * 400 + b"}", "an integer of 400 digits"),
        (b'{"token":"t","x":' + b"[" * 1000 + b"]" * 1000 + b"}", "nested 1001 deep"),
        (b"<html>", "not valid JSON"),
    ],
)
async def test_a_broken_token_answer_is_a_registry_error(
    scripted: Callable[[Handler], ScriptedRegistry], token_answer: bytes, message: str
) -> None:
    server = scripted(_challenged("", token_answer))
    server.handler = _challenged(f'Bearer realm="http://{server.host}/token"', token_answer)
    error = await _look_up(server)
    assert isinstance(error, RegistryError)
    assert message in error.message


@pytest.mark.parametrize(
    "realm", ["file:///etc/passwd", "http://x/t\r\nX: y", "http://[::1/t", "h" * 9000]
)
async def test_a_realm_that_is_no_http_url_is_a_registry_error(
    scripted: Callable[[Handler], ScriptedRegistry], realm: str
) -> None:
    quoted = realm.replace("\r\n", "\\r\\n")
    server = scripted(_challenged(f'Bearer realm="{quoted}"'))
    error = await _look_up(server)
    assert isinstance(error, RegistryError)
    assert "usable realm" in error.message


async def test_a_manifest_nested_1000_deep_is_image_not_found(
    scripted: Callable[[Handler], ScriptedRegistry],
) -> None:
    body = b'{"schemaVersion":2,"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    server = scripted(lambda _target: _answer("200 OK", {}, body))
    error = await _look_up(server, digest)
    assert isinstance(error, ImageNotFound)
    assert "nested 1001 deep" in error.message


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([(f"X-{i}", "1") for i in range(80)], "header fields, more than"),
        ([("X-A", "a" * 60_000), ("X-B", "b" * 60_000)], "bytes, more than"),
        ([(f"X-{i}", "1") for i in range(120)], "more than 100 headers"),  # http.client's own
    ],
)
async def test_too_many_or_too_large_header_fields_are_unavailable(
    scripted: Callable[[Handler], ScriptedRegistry],
    headers: list[tuple[str, str]],
    message: str,
) -> None:
    server = scripted(lambda _target: _answer("200 OK", headers, b"{}"))
    error = await _look_up(server)
    assert isinstance(error, RegistryUnavailable)
    assert message in error.message


async def test_retry_after_is_capped_at_an_hour(
    scripted: Callable[[Handler], ScriptedRegistry],
) -> None:
    server = scripted(lambda _t: _answer("503 Unavailable", {"Retry-After": "9" * 10}, b""))
    error = await _look_up(server)
    assert isinstance(error, RegistryError)
    assert error.retry_after_s == 3600.0


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://x/blob", "http://" + "h" * 9000])
async def test_a_redirect_nodeagent_does_not_follow_is_unavailable(
    scripted: Callable[[Handler], ScriptedRegistry], location: str
) -> None:
    server = scripted(lambda _t: _answer("307 Temporary Redirect", {"Location": location}, b""))
    sink = bytearray()
    with pytest.raises(RegistryUnavailable, match="redirected to") as caught:
        await _client(server).fetch_to(
            f"{server.host}/app@{DIGEST}", DIGEST, _Buffer(sink), max_bytes=10
        )
    assert len(str(caught.value)) < 800
    assert not sink


async def test_a_blob_larger_than_its_bound_is_refused_before_its_body(
    scripted: Callable[[Handler], ScriptedRegistry],
) -> None:
    server = scripted(lambda _t: _answer("200 OK", {}, b"x" * 100))
    sink = bytearray()
    with pytest.raises(RegistryUnavailable, match="more than the 10 allowed"):
        await _client(server).fetch_to(
            f"{server.host}/app@{DIGEST}", DIGEST, _Buffer(sink), max_bytes=10
        )
    assert not sink


class _Buffer:
    def __init__(self, into: bytearray) -> None:
        self.into = into

    def write(self, data: bytes, /) -> int:
        self.into.extend(data)
        return len(data)


async def test_a_chunked_blob_is_cut_one_byte_past_its_bound(
    scripted: Callable[[Handler], ScriptedRegistry],
) -> None:
    """No Content-Length to refuse: the body is read in bounded pieces, never whole."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (10, b"x" * 10) for _ in range(1000)) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    server = scripted(lambda _t: head + chunks)
    sink = bytearray()
    with pytest.raises(RegistryUnavailable, match="more than 10 B"):
        await _client(server).fetch_to(
            f"{server.host}/app@{DIGEST}", DIGEST, _Buffer(sink), max_bytes=10
        )
    assert len(sink) == 11
