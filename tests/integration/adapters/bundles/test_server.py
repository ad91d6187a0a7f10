"""Offline import: the bundle server as a registries.conf mirror for a real CRI-O.

The images are named after a registry that does not exist
(``registry.factory.invalid:5000``): every successful pull here came from the
bundle server, through the mirror drop-in, and nothing else.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import socket
import time
import tomllib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.bundles.manifest import BundleError
from nodeagent.bundles.mirror import DROPIN_NAME, mirror_repositories, served_blobs
from nodeagent.bundles.signatures import signature_tag
from nodeagent.errors import ConfigInvalid, NodeAgentError, RegistryUnavailable
from nodeagent.references import parse_pinned_image_ref
from tests.testenv.crio import Crio
from tests.testenv.images import (
    MEDIA_TYPE_INDEX,
    BuiltImage,
    BuiltIndex,
    LayerSpec,
    TestImage,
    build_index,
)
from tests.testenv.oci_layout import OciLayout, write_oci_layout
from tests.testenv.waiting import wait_for_async

HOST = "registry.factory.invalid:5000"
CHUNK_BYTES = 64 * 1024
"""Small pipeline chunks, so the test images' layers take the multi-chunk path."""
PULL_TIMEOUT_S = 120.0

Response = tuple[int, dict[str, str], bytes]


@pytest.fixture
def layout(tmp_path: Path) -> OciLayout:
    base = LayerSpec(128 * 1024, seed=71)
    app = TestImage("factory/app", [base, LayerSpec(320 * 1024, seed=72)]).build()
    tools = TestImage("factory/tools", [base, LayerSpec(96 * 1024, seed=73)]).build()
    amd64 = TestImage("factory/multi", [LayerSpec(64 * 1024, seed=74)]).build()
    arm64 = TestImage("factory/multi", [LayerSpec(48 * 1024, seed=75)], architecture="arm64")
    multi = build_index([amd64, arm64.build()])
    return write_oci_layout(tmp_path / "bundle", HOST, [app, tools, multi])


@pytest.fixture(autouse=True)
async def no_stray_errors() -> AsyncIterator[None]:
    """Fail a test when a server task dies with an exception nobody handled."""
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    yield
    assert errors == []


@pytest.fixture
async def server(layout: OciLayout) -> AsyncIterator[BundleServer]:
    blobs = served_blobs(layout.manifest)
    async with BundleServer(layout.root, blobs, chunk_bytes=CHUNK_BYTES) as bundle_server:
        yield bundle_server


class Reported:
    """``on_rejected`` port that lets a test wait for the server's report."""

    def __init__(self) -> None:
        self.errors: list[BundleError] = []
        self.digests: list[str] = []
        self._event = asyncio.Event()

    def __call__(self, digest: str, error: BundleError) -> None:
        self.digests.append(digest)
        self.errors.append(error)
        self._event.set()

    async def wait(self) -> list[str]:
        await asyncio.wait_for(self._event.wait(), timeout=30)
        return [error.reason for error in self.errors]


def request(
    port: int, method: str, path: str, headers: Mapping[str, str] | None = None
) -> Response:
    return exchange(port, [(method, path, headers or {})])[0]


def exchange(port: int, requests: Sequence[tuple[str, str, Mapping[str, str]]]) -> list[Response]:
    """Send ``requests`` one after the other on one keep-alive connection, then ``GET /v2/``.

    The server answers a connection's requests in order and updates its
    counters before it reads the next one: once the final answer is in, the
    counters include every request before it.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    responses = []
    try:
        for method, path, headers in [*requests, ("GET", "/v2/", {})]:
            conn.request(method, path, headers=dict(headers))
            response = conn.getresponse()
            body = response.read()
            responses.append(
                (response.status, {k.lower(): v for k, v in response.getheaders()}, body)
            )
    finally:
        conn.close()
    return responses[:-1]


async def fetch(server: BundleServer, method: str, path: str, **headers: str) -> Response:
    return await asyncio.to_thread(request, server.port, method, path, headers)


def error_code(body: bytes) -> str:
    code: str = json.loads(body)["errors"][0]["code"]
    return code


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def single(image: BuiltImage | BuiltIndex) -> BuiltImage:
    """One of the layout's single-platform images (``layout`` holds app, tools, multi)."""
    assert isinstance(image, BuiltImage)
    return image


def index(image: BuiltImage | BuiltIndex) -> BuiltIndex:
    """The layout's multi-platform image."""
    assert isinstance(image, BuiltIndex)
    return image


async def mirror_on(crio: Crio, layout: OciLayout, server: BundleServer) -> MirrorDropin:
    dropin = MirrorDropin(crio.registries_dir / DROPIN_NAME)
    repositories = mirror_repositories(image.ref for image in layout.manifest.images)
    assert dropin.write(repositories, server.mirror_host)
    await asyncio.to_thread(crio.reload)
    return dropin


# ------------------------------------------------------------------ through CRI-O
async def test_pulls_by_original_name_come_from_the_bundle(
    fresh_crio: Crio, layout: OciLayout, server: BundleServer
) -> None:
    app, multi = single(layout.images[0]), index(layout.images[2])
    await mirror_on(fresh_crio, layout, server)
    async with CriClient(fresh_crio.endpoint) as cri:
        for image in (app, multi):
            ref = layout.ref(image)
            await cri.pull_image(ref, timeout_s=PULL_TIMEOUT_S)
            status = await cri.image_status(ref)
            assert status is not None
            assert ref in status.repo_digests
            assert not any("127.0.0.1" in name for name in status.names())
    blobs = [*app.blobs(), *multi.images[0].blobs()]  # not the arm64 image's
    # CRI-O fetches the named manifest twice (to resolve it, then to pull), an index's child once
    manifests = [app.manifest, app.manifest, multi.manifest, multi.manifest]
    manifests.append(multi.images[0].manifest)
    wanted_bytes = sum(blob.size_bytes for blob in [*blobs, *manifests])
    await server.settled()
    assert server.counters.bytes_served == wanted_bytes
    assert server.counters.blobs_served == len(blobs)
    assert server.counters.manifests_served == len(manifests)
    assert server.rejections == ()


async def test_without_the_mirror_the_bundle_host_is_unreachable(
    fresh_crio: Crio, layout: OciLayout, server: BundleServer
) -> None:
    app, tools, _ = layout.images
    dropin = await mirror_on(fresh_crio, layout, server)
    async with CriClient(fresh_crio.endpoint) as cri:
        await cri.pull_image(layout.ref(app), timeout_s=PULL_TIMEOUT_S)
        assert dropin.remove()
        assert not dropin.remove()
        await asyncio.to_thread(fresh_crio.reload)
        before = server.counters.requests
        with pytest.raises(RegistryUnavailable, match=r"registry\.factory\.invalid"):
            await cri.pull_image(layout.ref(tools), timeout_s=PULL_TIMEOUT_S)
        assert server.counters.requests == before
        assert await cri.image_status(layout.ref(tools)) is None
        assert await cri.image_status(layout.ref(app)) is not None


async def test_pull_by_tag_skips_the_digest_only_mirror(
    fresh_crio: Crio, layout: OciLayout, server: BundleServer
) -> None:
    await mirror_on(fresh_crio, layout, server)
    before = server.counters.requests
    async with CriClient(fresh_crio.endpoint) as cri:
        with pytest.raises(RegistryUnavailable, match=r"registry\.factory\.invalid"):
            await cri.pull_image(f"{HOST}/factory/tools:latest", timeout_s=PULL_TIMEOUT_S)
    assert server.counters.requests == before


async def test_tampered_layer_never_reaches_the_store(fresh_crio: Crio, layout: OciLayout) -> None:
    app = single(layout.images[0])
    layer = app.layers[1]
    blobs = served_blobs(layout.manifest)
    flip_byte(layout.blob_file(layer.digest), layer.size_bytes // 2)
    reported = Reported()
    server = BundleServer(layout.root, blobs, chunk_bytes=CHUNK_BYTES, on_rejected=reported)
    async with server, CriClient(fresh_crio.endpoint) as cri:
        await mirror_on(fresh_crio, layout, server)
        with pytest.raises(NodeAgentError):
            await cri.pull_image(layout.ref(app), timeout_s=PULL_TIMEOUT_S)
        assert await cri.image_status(layout.ref(app)) is None
        assert layout.ref(app) not in {n for i in await cri.list_images() for n in i.names()}
        await server.settled()
        assert [error.reason for error in server.rejections] == ["BundleDigestMismatch"]
    assert reported.errors == list(server.rejections)
    assert reported.digests == [layer.digest]  # what the session process reports (decision 0064)
    assert layout.blob_file(layer.digest).name in str(reported.errors[0])


# ------------------------------------------------------------------ HTTP semantics
async def test_api_base_on_loopback(server: BundleServer) -> None:
    assert server.mirror_host == f"127.0.0.1:{server.port}"
    status, headers, body = await fetch(server, "GET", "/v2/")
    assert (status, headers["docker-distribution-api-version"], body) == (
        200,
        "registry/2.0",
        b"{}",
    )


async def test_manifests_by_digest_under_any_name(layout: OciLayout, server: BundleServer) -> None:
    app, _, multi = layout.images
    for name in ("factory/app", "any/other-name"):
        status, headers, body = await fetch(server, "GET", f"/v2/{name}/manifests/{app.digest}")
        assert status == 200
        assert body == app.manifest.data
        assert headers["content-type"] == app.manifest.media_type
        assert headers["docker-content-digest"] == app.digest
    status, headers, body = await fetch(
        server, "HEAD", f"/v2/factory/multi/manifests/{multi.digest}"
    )
    assert (status, body, headers["content-type"]) == (200, b"", MEDIA_TYPE_INDEX)
    assert headers["content-length"] == str(multi.manifest.size_bytes)


async def test_manifest_errors(layout: OciLayout, server: BundleServer) -> None:
    app = single(layout.images[0])
    cases = {
        "/v2/factory/app/manifests/latest": (404, "MANIFEST_UNKNOWN"),
        f"/v2/factory/app/manifests/sha256:{'0' * 64}": (404, "MANIFEST_UNKNOWN"),
        f"/v2/factory/app/manifests/{app.layers[0].digest}": (404, "MANIFEST_UNKNOWN"),
        f"/v2/factory/app/manifests/{app.config.digest}": (404, "MANIFEST_UNKNOWN"),
        "/v2/factory/app/manifests/md5:abc": (400, "DIGEST_INVALID"),
        f"/v2/Factory/App/manifests/{app.digest}": (400, "NAME_INVALID"),
        "/v2/_catalog": (404, "UNSUPPORTED"),
        "/v2/factory/app/tags/list": (404, "UNSUPPORTED"),
    }
    for path, (want_status, want_code) in cases.items():
        status, headers, body = await fetch(server, "GET", path)
        assert (status, error_code(body)) == (want_status, want_code), path
        assert headers["content-type"] == "application/json"
        assert headers["docker-distribution-api-version"] == "registry/2.0"


async def test_blob_get_head_and_ranges(layout: OciLayout, server: BundleServer) -> None:
    layer = single(layout.images[0]).layers[1]
    data = layer.path.read_bytes()
    path = f"/v2/factory/app/blobs/{layer.digest}"
    ranges = ["bytes=10-19", "bytes=-7", f"bytes={len(data)}-", "bytes=0-1,5-6"]
    requests: list[tuple[str, str, dict[str, str]]] = [("HEAD", path, {}), ("GET", path, {})]
    requests += [("GET", path, {"Range": value}) for value in ranges]
    head, whole, first, suffix, past_end, several = await asyncio.to_thread(
        exchange, server.port, requests
    )
    assert (head[0], head[2], head[1]["content-length"]) == (200, b"", str(len(data)))
    assert head[1]["docker-content-digest"] == layer.digest
    assert (whole[0], whole[2]) == (200, data)
    assert (first[0], first[2]) == (206, data[10:20])
    assert first[1]["content-range"] == f"bytes 10-19/{len(data)}"
    assert (suffix[0], suffix[2]) == (206, data[-7:])
    assert (past_end[0], past_end[1]["content-range"]) == (416, f"bytes */{len(data)}")
    assert (several[0], several[2]) == (200, data)  # several ranges: the whole blob
    assert server.counters.blobs_served == 2
    assert server.counters.bytes_hashed == len(data)


async def test_blob_is_hashed_once_however_often_served(
    layout: OciLayout, server: BundleServer
) -> None:
    layer = single(layout.images[0]).layers[1]
    get: tuple[str, str, dict[str, str]] = ("GET", f"/v2/x/blobs/{layer.digest}", {})
    responses = await asyncio.to_thread(exchange, server.port, [get, get, get])
    assert [(status, len(body)) for status, _, body in responses] == [(200, layer.size_bytes)] * 3
    assert server.counters.bytes_hashed == layer.size_bytes
    assert server.counters.bytes_served == 3 * layer.size_bytes
    assert server.counters.blobs_served == 3


async def test_only_listed_blobs_are_served(layout: OciLayout, server: BundleServer) -> None:
    extra = b"not in bundle.json"
    extra_hex = hashlib.sha256(extra).hexdigest()
    (layout.root / "blobs" / "sha256" / extra_hex).write_bytes(extra)
    status, _, body = await fetch(server, "GET", f"/v2/factory/app/blobs/sha256:{extra_hex}")
    assert (status, error_code(body)) == (404, "BLOB_UNKNOWN")
    escapes = ["/v2/../../etc/passwd", "/v2/a/blobs/../../../bundle.json", "/bundle.json"]
    escapes += ["/v2/a/blobs/sha256:..%2f..%2fbundle.json", f"/blobs/sha256/{extra_hex}"]
    for path in escapes:
        status, _, body = await fetch(server, "GET", path)
        assert status in (400, 404), path
        assert "errors" in json.loads(body)


async def test_writes_are_refused(server: BundleServer) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        status, headers, body = await fetch(server, method, "/v2/factory/app/blobs/uploads/")
        assert (status, headers["allow"], error_code(body)) == (405, "GET, HEAD", "UNSUPPORTED")


async def test_tampered_large_blob_is_cut_short_then_refused(layout: OciLayout) -> None:
    layer = single(layout.images[0]).layers[1]
    flip_byte(layout.blob_file(layer.digest), 3)
    async with BundleServer(
        layout.root, served_blobs(layout.manifest), chunk_bytes=CHUNK_BYTES
    ) as server:
        path = f"/v2/factory/app/blobs/{layer.digest}"
        with pytest.raises(http.client.IncompleteRead) as cut:
            await fetch(server, "GET", path)
        assert len(cut.value.partial) <= layer.size_bytes - 1
        assert len(cut.value.partial) == server.counters.bytes_served
        assert [error.reason for error in server.rejections] == ["BundleDigestMismatch"]
        for method in ("GET", "HEAD"):
            status, _, _ = await fetch(
                server, method, path, Range=f"bytes={len(cut.value.partial)}-"
            )
            assert status == 404
        assert server.counters.blobs_served == 0


@pytest.mark.parametrize("read_bytes", [1, 1000, 3 * CHUNK_BYTES])
async def test_damage_is_reported_when_the_client_leaves_early(
    layout: OciLayout, read_bytes: int
) -> None:
    """Once the answer has begun (the client read a byte of it), the digest is finished.

    A request whose connection is gone before the server took it up is not answered at all
    (aiohttp drops it), so nothing of the blob is read then: that case reports nothing.
    """
    layer = single(layout.images[0]).layers[1]
    flip_byte(layout.blob_file(layer.digest), 200)

    def leave_early(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET /v2/a/blobs/{layer.digest} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            if read_bytes:
                sock.recv(read_bytes)

    reported = Reported()
    blobs = served_blobs(layout.manifest)
    async with BundleServer(
        layout.root, blobs, chunk_bytes=CHUNK_BYTES, on_rejected=reported
    ) as server:
        await asyncio.to_thread(leave_early, server.port)
        assert await reported.wait() == ["BundleDigestMismatch"]
        assert server.counters.bytes_served < layer.size_bytes


async def test_tampered_small_blob_is_never_sent(layout: OciLayout) -> None:
    config = single(layout.images[0]).config
    flip_byte(layout.blob_file(config.digest), 0)
    async with BundleServer(layout.root, served_blobs(layout.manifest)) as server:
        status, _, body = await fetch(server, "GET", f"/v2/factory/app/blobs/{config.digest}")
        assert (status, error_code(body)) == (404, "BLOB_UNKNOWN")
        assert server.counters.bytes_served == 0
        assert [error.reason for error in server.rejections] == ["BundleDigestMismatch"]


async def test_tampered_manifest_is_refused(layout: OciLayout) -> None:
    app = layout.images[0]
    flip_byte(layout.blob_file(app.digest), 5)
    async with BundleServer(layout.root, served_blobs(layout.manifest)) as server:
        status, _, body = await fetch(server, "GET", f"/v2/factory/app/manifests/{app.digest}")
        assert (status, error_code(body)) == (404, "MANIFEST_UNKNOWN")
        assert [error.reason for error in server.rejections] == ["BundleDigestMismatch"]


async def test_symlinked_blob_is_refused(layout: OciLayout, tmp_path: Path) -> None:
    layer = single(layout.images[0]).layers[1]
    blob = layout.blob_file(layer.digest)
    moved = tmp_path / "outside"
    blob.rename(moved)
    blob.symlink_to(moved)
    async with BundleServer(layout.root, served_blobs(layout.manifest)) as server:
        status, _, _ = await fetch(server, "GET", f"/v2/factory/app/blobs/{layer.digest}")
        assert status == 404
        assert [error.reason for error in server.rejections] == ["BundleUnsafeEntry"]


async def test_tls_client_hello_is_answered_at_once(server: BundleServer) -> None:
    """containers-image tries TLS first: the ClientHello gets a 400 and the connection ends
    at once (measured here: the whole exchange, to the server's close, well under 1 s),
    where waiting for more bytes would cost each ping a 10 s TLS handshake timeout."""

    def hello() -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03")
            received = b""
            while chunk := sock.recv(4096):  # to the server's close
                received += chunk
            return received, time.monotonic() - started

    received, seconds = await asyncio.to_thread(hello)
    assert received.startswith((b"HTTP/1.1 400 ", b"HTTP/1.0 400 ")), received[:64]
    assert seconds < 1.0


async def test_request_heads_are_bounded(server: BundleServer) -> None:
    """A request line or header line over 8 KiB, or more than 64 headers, is answered 400 and
    the connection closed (the listener's bounds), before anything is looked up."""

    def raw(head: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head)
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
            return received

    long_line = b"GET /v2/" + b"a" * (9 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    long_header = b"GET /v2/ HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (9 << 10) + b"\r\n\r\n"
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(100))
    many_headers = b"GET /v2/ HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"
    for head in (long_line, long_header, many_headers):
        answer = await asyncio.to_thread(raw, head)
        assert answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]
    before = server.counters.requests
    assert (
        await asyncio.to_thread(
            raw, b"GET /v2/ HTTP/1.1\r\nHost: x\r\n" + many[:300] + b"Connection: close\r\n\r\n"
        )
    ).startswith(b"HTTP/1.1 200")
    assert server.counters.requests == before + 1


# ------------------------------------------------------------------ the drop-in
def test_dropin_mirrors_each_repository_by_digest_only(tmp_path: Path) -> None:
    refs = [
        parse_pinned_image_ref(f"{HOST}/factory/app@sha256:{'a' * 64}"),
        parse_pinned_image_ref(f"{HOST}/factory/app@sha256:{'b' * 64}"),
        parse_pinned_image_ref(f"docker.io/busybox@sha256:{'c' * 64}"),
    ]
    repositories = mirror_repositories(refs)
    assert repositories == ("docker.io/library/busybox", f"{HOST}/factory/app")
    dropin = MirrorDropin(tmp_path / "registries.conf.d" / DROPIN_NAME)
    assert dropin.write(repositories, "127.0.0.1:41000")
    assert not dropin.write(repositories, "127.0.0.1:41000")
    doc = tomllib.loads(dropin.path.read_text())
    assert doc["registry"][1] == {
        "prefix": f"{HOST}/factory/app",
        "location": f"{HOST}/factory/app",
        "mirror": [
            {"location": "127.0.0.1:41000/factory/app", "insecure": True,
             "pull-from-mirror": "digest-only"},
        ],
    }  # fmt: skip
    assert doc["registry"][0]["mirror"][0]["location"] == "127.0.0.1:41000/library/busybox"
    assert dropin.write(repositories, "127.0.0.1:41001")
    assert dropin.remove()
    assert not dropin.path.exists()
    with pytest.raises(ConfigInvalid):
        MirrorDropin(tmp_path / "mirror.toml")


async def test_only_listed_signature_tags_are_served(layout: OciLayout) -> None:
    """A tag is answered only when the verified manifest lists it, for its own repository,
    with a listed manifest (here the tools image's manifest plays the signature's part)."""
    app, tools = single(layout.images[0]), single(layout.images[1])
    tag = signature_tag(app.digest)
    unlisted = f"sha256:{'7' * 64}"
    tags = {f"factory/app/{tag}": tools.digest, f"factory/tools/{tag}": unlisted}
    blobs = served_blobs(layout.manifest)
    async with BundleServer(layout.root, blobs, tags=tags) as tagged:
        for method in ("GET", "HEAD"):
            status, headers, body = await fetch(tagged, method, f"/v2/factory/app/manifests/{tag}")
            assert status == 200
            assert body == (tools.manifest.data if method == "GET" else b"")
            assert headers["docker-content-digest"] == tools.digest
            assert headers["content-type"] == tools.manifest.media_type
        for path in (
            f"/v2/factory/tools/manifests/{tag}",  # listed, but its manifest is not a blob
            f"/v2/factory/other/manifests/{tag}",  # another repository
            f"/v2/factory/app/manifests/{signature_tag(tools.digest)}",  # not listed
        ):
            status, _, body = await fetch(tagged, "GET", path)
            assert (status, error_code(body)) == (404, "MANIFEST_UNKNOWN"), path
    async with BundleServer(layout.root, blobs) as untagged:
        status, _, body = await fetch(untagged, "GET", f"/v2/factory/app/manifests/{tag}")
        assert (status, error_code(body)) == (404, "MANIFEST_UNKNOWN")


async def test_a_blob_awaited_while_it_is_copied_is_served_once_it_arrives(
    layout: OciLayout,
) -> None:
    """Decision 0079: an import serves the store while its copy still runs. A listed blob not
    there yet is awaited (``arrival_wait_s``); the request is answered, whole and checked,
    once the file is in place, as the copier puts it (written aside, then renamed)."""
    layer = single(layout.images[0]).layers[1]
    blob = layout.blob_file(layer.digest)
    data = blob.read_bytes()
    aside = blob.with_name(blob.name + ".partial")
    blob.rename(aside)
    async with BundleServer(
        layout.root, served_blobs(layout.manifest), chunk_bytes=CHUNK_BYTES, arrival_wait_s=30
    ) as server:
        asked = asyncio.create_task(fetch(server, "GET", f"/v2/factory/app/blobs/{layer.digest}"))
        await wait_for_async(
            lambda: seen(server), timeout_s=10, what="the request to reach the server"
        )
        assert not asked.done()  # awaiting the blob
        aside.rename(blob)
        status, headers, body = await asked
    assert (status, headers["docker-content-digest"], body) == (200, layer.digest, data)
    assert server.rejections == ()


async def seen(server: BundleServer) -> bool:
    return server.counters.requests >= 1


async def test_a_blob_still_absent_after_the_wait_is_refused_as_missing(
    layout: OciLayout,
) -> None:
    layer = single(layout.images[0]).layers[1]
    layout.blob_file(layer.digest).unlink()
    async with BundleServer(
        layout.root, served_blobs(layout.manifest), arrival_wait_s=0.3
    ) as server:
        status, _, body = await fetch(server, "GET", f"/v2/factory/app/blobs/{layer.digest}")
        assert (status, error_code(body)) == (404, "BLOB_UNKNOWN")
        assert [error.reason for error in server.rejections] == ["BundleIncomplete"]


async def test_only_an_absent_blob_is_awaited_a_damaged_one_is_refused_at_once(
    layout: OciLayout,
) -> None:
    config = single(layout.images[0]).config
    flip_byte(layout.blob_file(config.digest), 0)
    async with BundleServer(
        layout.root, served_blobs(layout.manifest), arrival_wait_s=600
    ) as server:
        started = time.monotonic()
        status, _, body = await fetch(server, "GET", f"/v2/factory/app/blobs/{config.digest}")
        assert (status, error_code(body)) == (404, "BLOB_UNKNOWN")
        assert time.monotonic() - started < 10
        assert [error.reason for error in server.rejections] == ["BundleDigestMismatch"]
