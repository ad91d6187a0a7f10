"""The peer server over a real store, real TLS and real clients (skopeo, Python's ssl).

A throwaway CA (``tests.testenv.pki``) issues the node's serving certificate (IP SAN
127.0.0.1, certificate and key in one file, as the kubelet's) and the peers' client
certificates; a second, unrelated CA issues one that must be refused. The store is filled
from a signed bundle by the store's own copier. Loopback only.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import http.client
import json
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from structlog.testing import capture_logs

from nodeagent.adapters.http.peer import PeerServer
from nodeagent.adapters.http.tls import ReloadingTls
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.keeper import set_aside_corrupt, verify
from nodeagent.site.holdings import BundleHolding, parse_have, parse_holdings
from nodeagent.site.limits import RETRY_AFTER_S
from tests.testenv.pki import Authority, Issued, cert_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle, with_sigstore
from tests.testenv.sigstore import SigningKey
from tests.testenv.waiting import wait_for_async

MIB = 1 << 20
CHUNK_BYTES = 64 << 10
"""Small pipeline chunks: the test layers take the multi-chunk (held-back last chunk) path."""

Response = tuple[int, dict[str, str], bytes]


@dataclass
class Pki:
    ca: Authority
    other_ca: Authority
    server_file: Path
    ca_file: Path
    directory: Path

    def client_context(self, client: Issued | None, ca: Authority | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        if client is not None:
            name = hashlib.sha256(client.cert_pem).hexdigest()[:12]
            cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
            client.write_pair(cert, key)
            context.load_cert_chain(cert, key)
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "pki"
    directory.mkdir()
    ca, other = Authority("site CA"), Authority("another CA")
    server_file, ca_file = directory / "kubelet-server-current.pem", directory / "ca.crt"
    ca.serving("node-0").write_pair(server_file, server_file)
    ca_file.write_bytes(ca.cert_pem)
    return Pki(ca, other, server_file, ca_file, directory)


@pytest.fixture
def bundle(tmp_path: Path) -> Signed:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    app = image("example/app", [(MIB, 1), (2 * MIB, 2)], cache)
    tools = image("example/tools", [(MIB, 1), (MIB // 2, 3)], cache)
    signed = signed_bundle(
        tmp_path / "stick", keys, [app, tools], bundle_id="site-2026-11", set_name="site"
    )
    copy_bundle(tmp_path / "store", signed.root, signed.manifest, keys.trusted_dir)
    return signed


def peer_server(
    tmp_path: Path, pki: Pki, on_corrupt: Callable[[str], object] | None = None, **limits: int
) -> PeerServer:
    return PeerServer(
        tmp_path / "store",
        ReloadingTls(pki.server_file, pki.server_file, pki.ca_file),
        node="node-0",
        host="127.0.0.1",
        port=0,
        max_uploads=limits.get("max_uploads", 4),
        upload_max_bytes=limits.get("upload_max_bytes", 0),
        request_timeout_s=limits.get("request_timeout_s", 20),
        chunk_bytes=CHUNK_BYTES,
        offer_ttl_s=0,
        on_corrupt=on_corrupt,
    )


@pytest.fixture
async def server(tmp_path: Path, pki: Pki, bundle: Signed) -> AsyncIterator[PeerServer]:
    async with peer_server(tmp_path, pki) as peer:
        yield peer


def fetch(port: int, context: ssl.SSLContext, method: str, path: str, **headers: str) -> Response:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


def largest_layer(bundle: Signed) -> str:
    return max(bundle.manifest.blobs.items(), key=lambda item: item[1].size_bytes)[0]


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["skopeo", *args], capture_output=True, text=True, check=False, timeout=60
    )


# ------------------------------------------------------------------ standard clients
async def test_skopeo_copies_an_image_from_the_peer_store(
    server: PeerServer, pki: Pki, bundle: Signed, tmp_path: Path
) -> None:
    certs = cert_dir(tmp_path / "certs.d", pki.ca, pki.ca.client("node-1"))
    ref = bundle.manifest.images[0]
    source = f"docker://127.0.0.1:{server.port}/any/name@{ref.manifest_digest}"
    inspected = await asyncio.to_thread(
        skopeo, "inspect", "--raw", "--cert-dir", str(certs), source
    )
    assert inspected.returncode == 0, inspected.stderr
    raw = inspected.stdout.encode()
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == ref.manifest_digest
    destination = tmp_path / "copied"
    copied = await asyncio.to_thread(
        skopeo, "copy", "--src-cert-dir", str(certs), source, f"oci:{destination}:app"
    )
    assert copied.returncode == 0, copied.stderr
    index = json.loads((destination / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [ref.manifest_digest]
    for digest in json.loads(raw)["layers"]:
        copy = destination / "blobs" / "sha256" / digest["digest"].removeprefix("sha256:")
        assert f"sha256:{hashlib.sha256(copy.read_bytes()).hexdigest()}" == digest["digest"]
    assert server.corrupt == []


async def test_a_client_without_the_sites_certificate_fails_the_handshake(
    server: PeerServer, pki: Pki, tmp_path: Path
) -> None:
    requests_before = server.counters.requests
    for client in (None, pki.other_ca.client("intruder")):
        context = pki.client_context(client)
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            await asyncio.to_thread(fetch, server.port, context, "GET", "/v2/")
    without = cert_dir(tmp_path / "no-client-cert", pki.ca, None)
    other = cert_dir(tmp_path / "other-ca-cert", pki.ca, pki.other_ca.client("intruder"))
    for certs in (without, other):
        inspected = await asyncio.to_thread(
            skopeo, "inspect", "--cert-dir", str(certs), f"docker://127.0.0.1:{server.port}/a/b:c"
        )
        assert inspected.returncode != 0
        # the handshake is cut (TLS 1.3: after the client's Finished, so the client sees EOF)
        assert "pinging container registry" in inspected.stderr, inspected.stderr
    assert server.counters.requests == requests_before  # no request got through


# ------------------------------------------------------------------ the protocol
async def test_holdings_have_and_bundle_files_after_a_partial_store(
    server: PeerServer, pki: Pki, bundle: Signed, tmp_path: Path
) -> None:
    context = pki.client_context(pki.ca.client("node-1"))
    store = tmp_path / "store"
    whole = await asyncio.to_thread(fetch, server.port, context, "GET", "/nodeagent/v1/holdings")
    assert whole[0] == 200 and whole[1]["content-type"] == "application/json"
    (complete,) = parse_holdings(whole[2]).bundles
    signed_bytes = (bundle.root / "bundle.json").read_bytes()
    assert complete.manifest_digest == f"sha256:{hashlib.sha256(signed_bytes).hexdigest()}"
    assert complete.is_complete and complete.blobs == len(bundle.manifest.blobs)
    gone = largest_layer(bundle)
    BlobStore(store).path(gone).unlink()  # the store lost one blob (a partial store)
    holdings = parse_holdings(
        (await asyncio.to_thread(fetch, server.port, context, "GET", "/nodeagent/v1/holdings"))[2]
    )
    assert (holdings.node, holdings.uploads_active, holdings.uploads_max) == ("node-0", 0, 4)
    (partial,) = holdings.bundles
    assert not partial.is_complete
    assert partial.blobs_held == partial.blobs - 1
    assert partial.bytes_held == partial.bytes - bundle.manifest.blobs[gone].size_bytes
    status, _, body = await asyncio.to_thread(
        fetch, server.port, context, "GET", "/nodeagent/v1/bundles/site-2026-11/have"
    )
    have = parse_have(body)
    ordered = sorted(bundle.manifest.blobs)
    assert [ordered[i] for i in range(have.blobs) if not have.is_held(i)] == [gone]
    status, _, _ = await asyncio.to_thread(
        fetch, server.port, context, "GET", f"/v2/a/blobs/{gone}"
    )
    assert status == 404
    for name in ("bundle.json", "bundle.json.minisig"):
        status, _, body = await asyncio.to_thread(
            fetch, server.port, context, "GET", f"/nodeagent/v1/bundles/site-2026-11/{name}"
        )
        assert (status, body) == (200, (bundle.root / name).read_bytes())


async def test_paths_never_reach_the_file_system(
    server: PeerServer, pki: Pki, bundle: Signed
) -> None:
    context = pki.client_context(pki.ca.client("node-1"))
    refused = [
        "/nodeagent/v1/bundles/../x",
        "/nodeagent/v1/bundles/../bundle.json",
        "/nodeagent/v1/bundles/%2e%2e/bundle.json",
        "/nodeagent/v1/bundles/site-2026-11%2f..%2f..%2fx/bundle.json",
        "/nodeagent/v1/bundles/site-2026-11/record.json",
        "/nodeagent/v1/bundles/site-2026-11/../../index.json",
        "/nodeagent/v1/bundles/unknown/have",
        "/nodeagent/v1/../../etc/passwd",
        "/v2/../../etc/passwd",
        "/v2/a/blobs/sha256:..%2f..%2findex.json",
        "/index.json",
        "/blobs/sha256/" + largest_layer(bundle).removeprefix("sha256:"),
    ]
    for path in refused:
        status, _, body = await asyncio.to_thread(fetch, server.port, context, "GET", path)
        assert status in (400, 404), path
        assert "errors" in json.loads(body), path
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = await asyncio.to_thread(
            fetch, server.port, context, method, "/nodeagent/v1/holdings"
        )
        assert (status, headers["allow"]) == (405, "GET, HEAD")
    manifest = bundle.manifest.images[0].manifest_digest
    status, _, body = await asyncio.to_thread(
        fetch, server.port, context, "GET", f"/v2/a/manifests/{manifest.replace(':', '-')}.sig"
    )
    assert (status, json.loads(body)["errors"][0]["code"]) == (404, "MANIFEST_UNKNOWN")


async def test_a_damaged_stored_blob_is_never_sent_whole(
    server: PeerServer, pki: Pki, bundle: Signed, tmp_path: Path
) -> None:
    layer = largest_layer(bundle)
    path = BlobStore(tmp_path / "store").path(layer)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    context = pki.client_context(pki.ca.client("node-1"))
    with pytest.raises(http.client.IncompleteRead) as cut:
        await asyncio.to_thread(fetch, server.port, context, "GET", f"/v2/a/blobs/{layer}")
    assert len(cut.value.partial) < len(data)
    await server.settled()
    assert [error.reason for error in server.corrupt] == ["StoreBlobCorrupt"]
    status, _, _ = await asyncio.to_thread(
        fetch, server.port, context, "GET", f"/v2/a/blobs/{layer}"
    )
    assert status == 404


def damage(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    return bytes(data)


async def test_a_damaged_blob_found_while_serving_is_set_aside_as_verify_would(
    pki: Pki, bundle: Signed, tmp_path: Path
) -> None:
    # As the daemon wires it (nodeagent.daemon.site): the store's own set_aside_corrupt.
    store = tmp_path / "store"
    layer = largest_layer(bundle)
    damage(BlobStore(store).path(layer))
    context = pki.client_context(pki.ca.client("node-1"))
    holdings_path = "/nodeagent/v1/holdings"
    async with peer_server(tmp_path, pki, functools.partial(set_aside_corrupt, store)) as server:
        (before,) = parse_holdings(
            (await asyncio.to_thread(fetch, server.port, context, "GET", holdings_path))[2]
        ).bundles
        with pytest.raises(http.client.IncompleteRead):
            await asyncio.to_thread(fetch, server.port, context, "GET", f"/v2/a/blobs/{layer}")

        async def holdings_without_it() -> BundleHolding | None:
            body = (await asyncio.to_thread(fetch, server.port, context, "GET", holdings_path))[2]
            (held,) = parse_holdings(body).bundles
            return held if held.blobs_held < before.blobs_held else None

        after = await wait_for_async(
            holdings_without_it, timeout_s=20, what="the damaged blob no longer held"
        )
        status, _, _ = await asyncio.to_thread(
            fetch, server.port, context, "GET", f"/v2/a/blobs/{layer}"
        )
    assert status == 404
    assert not BlobStore(store).path(layer).exists()
    size = bundle.manifest.blobs[layer].size_bytes
    assert (after.blobs_held, after.bytes_held) == (before.blobs_held - 1, before.bytes_held - size)
    assert [error.reason for error in server.corrupt] == ["StoreBlobCorrupt"]
    assert verify(store).is_ok  # nothing damaged left behind


def test_a_blob_stored_whole_again_is_not_set_aside(bundle: Signed, tmp_path: Path) -> None:
    # A report is not proof: the store hashes the blob again before removing anything.
    store = tmp_path / "store"
    layer = largest_layer(bundle)
    assert set_aside_corrupt(store, layer) is False
    assert BlobStore(store).path(layer).exists()
    damage(BlobStore(store).path(layer))
    assert set_aside_corrupt(store, layer) is True
    assert set_aside_corrupt(store, layer) is False  # gone already


def handshake_from(source: str, port: int, context: ssl.SSLContext) -> None:
    """Connect from ``source`` (another loopback address), shake hands, send a request."""
    with (
        socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=(source, 0)
        ) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n\r\n")
        if not tls.recv(1):  # TLS 1.3: the refusal arrives after the client's Finished
            raise ConnectionError("closed")


async def test_each_refused_peer_is_logged_once_a_minute_in_plain_words(
    server: PeerServer, pki: Pki
) -> None:
    other_ca = pki.client_context(pki.other_ca.client("intruder"))
    refusals = [("127.0.0.2", other_ca)] * 3 + [("127.0.0.3", pki.client_context(None))]
    with capture_logs() as logs:
        for source, context in refusals:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await asyncio.to_thread(handshake_from, source, server.port, context)

        def refused() -> list[MutableMapping[str, Any]]:
            return [entry for entry in logs if entry["event"] == "peer_refused"]

        await wait_for_async(
            lambda: asyncio.sleep(0, len(refused()) == 2), timeout_s=10, what="two lines"
        )
        # a certificate from the site CA is not refused, nor logged
        good = pki.client_context(pki.ca.client("node-1"))
        await asyncio.to_thread(handshake_from, "127.0.0.4", server.port, good)
    assert sorted((e["address"], e["reason"], e["log_level"]) for e in refused()) == [
        ("127.0.0.2", "certificate not signed by the site CA", "warning"),
        ("127.0.0.3", "no client certificate sent", "warning"),
    ]


async def test_the_server_certificate_is_rotated_without_restart(
    server: PeerServer, pki: Pki
) -> None:
    context = pki.client_context(pki.ca.client("node-1"))

    def served_serial() -> int:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    first = await asyncio.to_thread(served_serial)
    rotated = pki.ca.serving("node-0")
    # as the kubelet rotates (docs/runtime-facts.md): a new timestamped pair file, then the
    # -current.pem link re-pointed by renaming a new link over it
    pair = pki.directory / "kubelet-server-2026-11-25-10-00-00.pem"
    rotated.write_pair(pair, pair)
    updated = pki.directory / "kubelet-server-updated.pem"
    updated.symlink_to(pair)
    updated.replace(pki.server_file)
    second = await asyncio.to_thread(served_serial)
    assert first != second == rotated.certificate.serial_number
    status, _, _ = await asyncio.to_thread(fetch, server.port, context, "GET", "/v2/")
    assert status == 200
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
        await asyncio.to_thread(fetch, server.port, pki.client_context(None), "GET", "/v2/")


# ------------------------------------------------------------------ load
async def _hold_download(port: int, context: ssl.SSLContext, path: str) -> asyncio.StreamWriter:
    """A GET whose response head has arrived and whose body is left unread (a slot held)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    writer.write(f"GET {path} HTTP/1.1\r\nHost: peer\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=20)
    assert head.startswith(b"HTTP/1.1 200"), head
    return writer


async def test_uploads_beyond_the_limits_are_refused_with_retry_after(
    tmp_path: Path, pki: Pki, bundle: Signed
) -> None:
    # a slow cap keeps the downloads going while the test asks for more
    async with peer_server(tmp_path, pki, max_uploads=4, upload_max_bytes=64 << 10) as server:
        greedy = pki.client_context(pki.ca.client("node-1"))
        polite = pki.client_context(pki.ca.client("node-2"))
        third = pki.client_context(pki.ca.client("node-3"))
        path = f"/v2/a/blobs/{largest_layer(bundle)}"
        held = [await _hold_download(server.port, greedy, path) for _ in range(2)]
        status, headers, body = await asyncio.to_thread(fetch, server.port, greedy, "GET", path)
        assert (status, headers["retry-after"]) == (429, str(RETRY_AFTER_S))  # half the slots
        assert json.loads(body)["errors"][0]["code"] == "TOOMANYREQUESTS"
        held += [await _hold_download(server.port, polite, path) for _ in range(2)]
        assert server.slots.active == 4
        status, headers, _ = await asyncio.to_thread(fetch, server.port, third, "GET", path)
        assert (status, headers["retry-after"]) == (503, str(RETRY_AFTER_S))
        status, _, body = await asyncio.to_thread(
            fetch, server.port, third, "GET", "/nodeagent/v1/holdings"
        )
        assert parse_holdings(body).uploads_active == 4  # the signal, ahead of time
        status, _, _ = await asyncio.to_thread(fetch, server.port, third, "HEAD", path)
        assert status == 200  # a HEAD takes no slot
        for writer in held:
            writer.transport.abort()
        await server.settled()
        assert server.slots.active == 0


async def test_a_download_in_progress_holds_the_close_no_longer_than_its_grace(
    tmp_path: Path, pki: Pki, bundle: Signed
) -> None:
    # 2 MiB at 64 KiB/s would take 30 s: the daemon's stop must not wait for it
    server = peer_server(tmp_path, pki, upload_max_bytes=64 << 10, request_timeout_s=20)
    await server.start()
    context = pki.client_context(pki.ca.client("node-1"))
    held = await _hold_download(server.port, context, f"/v2/a/blobs/{largest_layer(bundle)}")
    started = time.monotonic()
    await server.close(grace_s=0.5)
    seconds = time.monotonic() - started
    held.transport.abort()
    assert seconds < 3, f"closing took {seconds:.1f} s with a download in progress"


async def test_the_bandwidth_cap_holds(tmp_path: Path, pki: Pki, bundle: Signed) -> None:
    cap = 1 * MIB
    async with peer_server(tmp_path, pki, upload_max_bytes=cap) as server:
        context = pki.client_context(pki.ca.client("node-1"))
        layer = largest_layer(bundle)
        started = time.monotonic()
        status, _, body = await asyncio.to_thread(
            fetch, server.port, context, "GET", f"/v2/a/blobs/{layer}"
        )
        seconds = time.monotonic() - started
    assert status == 200 and f"sha256:{hashlib.sha256(body).hexdigest()}" == layer
    burst = max(64 << 10, cap // 10)  # what the bucket holds when full (peer.PeerServer.start)
    rate = (len(body) - burst) / seconds
    print(f"bandwidth cap {cap} B/s: {len(body)} bytes in {seconds:.2f} s, {rate:.0f} B/s")
    assert 0.85 * cap <= rate <= 1.05 * cap


async def test_a_connection_that_sends_nothing_is_closed(
    tmp_path: Path, pki: Pki, bundle: Signed
) -> None:
    async with peer_server(tmp_path, pki, request_timeout_s=1) as server:
        context = pki.client_context(pki.ca.client("node-1"))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=context, server_hostname="127.0.0.1"
        )
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        assert 0.5 <= time.monotonic() - started <= 5
        writer.close()


async def test_a_stored_bundles_signature_tags_are_served(tmp_path: Path, pki: Pki) -> None:
    """The store offers the sigstore tags of a stored signed manifest, each answered with its
    stored, verified signature manifest; a tag no stored manifest lists is unknown."""
    keys = Keys.make(tmp_path / "keys")
    app = image("example/app", [(MIB // 4, 7)], tmp_path / "layers")
    plain = signed_bundle(tmp_path / "stick", keys, [app], bundle_id="signed-1", set_name="site")
    signed = with_sigstore(plain, keys, SigningKey())
    copy_bundle(tmp_path / "store", signed.root, signed.manifest, keys.trusted_dir)
    (entry,) = signed.manifest.image_signatures
    context = pki.client_context(pki.ca.client("node-1"))
    async with peer_server(tmp_path, pki) as peer:
        status, headers, body = await asyncio.to_thread(
            fetch, peer.port, context, "GET", f"/v2/example/app/manifests/{entry.tag}"
        )
        assert (status, headers["docker-content-digest"]) == (200, entry.manifest_digest)
        assert body == signed.blob_file(entry.manifest_digest).read_bytes()
        assert json.loads(body)["layers"][0]["annotations"]
        for path in (f"/v2/example/other/manifests/{entry.tag}",
                     f"/v2/example/app/manifests/sha256-{'0' * 64}.sig"):  # fmt: skip
            status, _, body = await asyncio.to_thread(fetch, peer.port, context, "GET", path)
            assert (status, json.loads(body)["errors"][0]["code"]) == (404, "MANIFEST_UNKNOWN")
