"""Attack: hostile requests to the node mirror from any local process.

Issue 25, item 7. The node mirror listens on loopback without TLS: every local process can
send it anything. Against the real ``NodeMirror`` over a real store: tags no signed
manifest lists, repositories the store does not hold, digests of files that are in the
store's directory but not its offer (records, signed manifests), traversal in every
spelling, over-long paths and heads, hostile ranges, methods that write, and a flood of
connections past the cap. Nothing outside the offer is ever answered with content, every
answer is a 4xx (never a 5xx, never a traceback), and the mirror serves normally after.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeagent.adapters.http.node_mirror import NodeMirror
from nodeagent.references import parse_pinned_image_ref
from nodeagent.store import layout
from tests.testenv.node_mirror import HeldStore, held_store, node_mirror
from tests.testenv.waiting import wait_for_async

MAX_CONNECTIONS = 16


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[HeldStore, NodeMirror]]:
    held = held_store(tmp_path)
    async with node_mirror(held, max_connections=MAX_CONNECTIONS) as server:
        yield held, server


def ask(
    port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def is_true(value: bool) -> bool | None:
    return value or None


def digest_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


async def test_unlisted_tags_unknown_names_and_files_outside_the_offer_are_404(
    served: tuple[HeldStore, NodeMirror],
) -> None:
    held, server = served
    ref = parse_pinned_image_ref(held.bundle_refs[0])
    repo, hexdigest = ref.repository, ref.digest.removeprefix("sha256:")
    outside = [
        digest_of(p)
        for p in held.root.rglob("*")
        if p.is_file() and not str(p.relative_to(held.root)).startswith("blobs/")
    ]
    assert outside  # records, signed manifests, index.json: in the store's directory
    asks = [
        ("GET", f"/v2/{repo}/manifests/latest"),
        ("GET", f"/v2/{repo}/manifests/sha256-{'0' * 64}.sig"),
        ("GET", f"/v2/{repo}/manifests/sha256-{hexdigest}.sig"),  # a tag nobody signed
        ("GET", f"/v2/not/held/manifests/{ref.digest}"),
        ("GET", f"/v2/other.example/{repo}/manifests/{ref.digest}"),
        ("GET", f"/v2/{repo}/blobs/sha256:{'f' * 64}"),
        *[("GET", f"/v2/{repo}/blobs/{digest}") for digest in outside],
        *[("GET", f"/v2/{repo}/manifests/{digest}") for digest in outside],
    ]
    for method, path in asks:
        status, body = await asyncio.to_thread(ask, server.port, method, path)
        assert status == 404, path
        assert body[:1] == b"{"  # a distribution error, never a file
    assert server.counters.served.bytes_served == 0


async def test_traversal_long_paths_and_writes_are_refused(
    served: tuple[HeldStore, NodeMirror],
) -> None:
    held, server = served
    ref = parse_pinned_image_ref(held.bundle_refs[0])
    secret = held.root / layout.MANIFEST_NAME
    traversals = [
        "/v2/../../etc/passwd",
        "/v2/%2e%2e/%2e%2e/etc/passwd",
        f"/v2/{ref.repository}/blobs/..%2f..%2f..%2fetc%2fpasswd",
        f"/v2/{ref.repository}/blobs/sha256:../../../../etc/passwd",
        f"/v2/../{ref.repository}/manifests/{ref.digest}",
        f"/v2/{ref.repository}/../../blobs/{ref.digest}",
        "/" + "a/" * 600,
        f"/v2/{'a/' * 600}manifests/{ref.digest}",
        "/v2/_catalog",
        f"/v2/{ref.repository}/tags/list",
    ]
    for path in traversals:
        status, body = await asyncio.to_thread(ask, server.port, "GET", path)
        assert 400 <= status < 500, path
        assert b"root:" not in body and secret.name.encode() not in body
    for method in ("PUT", "POST", "DELETE", "PATCH"):
        status, _ = await asyncio.to_thread(
            ask, server.port, method, f"/v2/{ref.repository}/blobs/uploads/"
        )
        assert status == 405
    long_head = {"X-Fill": "a" * (9 << 10)}
    status, _ = await asyncio.to_thread(ask, server.port, "GET", "/v2/", long_head)
    assert status == 400
    many = {f"X-{i}": "1" for i in range(100)}
    status, _ = await asyncio.to_thread(ask, server.port, "GET", "/v2/", many)
    assert status == 400
    for header in ("bytes=" + "9" * 5000 + "-", "bytes=0-1," * 300 + "0-1", "bytes=-0", "bytes=x"):
        status, _ = await asyncio.to_thread(
            ask, server.port, "GET", f"/v2/{ref.repository}/blobs/{ref.digest}", {"Range": header}
        )
        assert status in (200, 206, 416), header
    status, _ = await asyncio.to_thread(
        ask, server.port, "GET", f"/v2/{ref.repository}/manifests/{ref.digest}"
    )
    assert status == 200  # still serving


async def test_a_connection_flood_is_capped_and_the_mirror_serves_after(
    served: tuple[HeldStore, NodeMirror],
) -> None:
    held, server = served
    ref = parse_pinned_image_ref(held.bundle_refs[0])
    sockets = []
    try:
        for _ in range(MAX_CONNECTIONS * 4):
            sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        await wait_for_async(
            lambda: is_true(sum(server.door.refused.values()) >= MAX_CONNECTIONS * 2),
            timeout_s=20,
            what="connections past the cap refused",
        )
        assert server.door.open <= MAX_CONNECTIONS
    finally:
        for sock in sockets:
            sock.close()
    await wait_for_async(lambda: is_true(server.door.open == 0), timeout_s=20, what="closed")
    path = f"/v2/{ref.repository}/manifests/{ref.digest}"
    status, _ = await asyncio.to_thread(ask, server.port, "GET", path)
    assert status == 200
