"""Integration tests: a real docker-registry, test images pushed and read back over HTTP."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testenv.images import (
    MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
    LayerSpec,
    TestImage,
    build_index,
    push,
)
from tests.testenv.registry import Registry, RegistryStartError
from tests.testenv.waiting import WaitTimeout

pytestmark = pytest.mark.integration

KIB = 1024
ACCEPT = ", ".join([MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST])


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with Registry(tmp_path / "registry") as running:
        yield running


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


def _get(
    registry: Registry, path: str, method: str = "GET", accept: str = ACCEPT
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=10)
    try:
        conn.request(method, path, headers={"Accept": accept})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _fetch_manifest(registry: Registry, repository: str, reference: str) -> dict[str, Any]:
    status, headers, body = _get(registry, f"/v2/{repository}/manifests/{reference}")
    assert status == 200, body
    assert headers["docker-content-digest"] == _sha256(body)
    manifest: dict[str, Any] = json.loads(body)
    assert headers["content-type"] == manifest["mediaType"]
    return manifest


def _assert_blobs_served(registry: Registry, repository: str, manifest: dict[str, Any]) -> int:
    """Fetch config and layers of an image manifest; return their total size."""
    descriptors = [manifest["config"], *manifest["layers"]]
    for descriptor in descriptors:
        status, _, blob = _get(registry, f"/v2/{repository}/blobs/{descriptor['digest']}")
        assert status == 200
        assert _sha256(blob) == descriptor["digest"]
        assert len(blob) == descriptor["size"]
    return sum(int(d["size"]) for d in descriptors)


def test_pushed_image_is_served_by_digest_and_tag(registry: Registry, cache_dir: Path) -> None:
    image = TestImage("example/app", [LayerSpec(64 * KIB, 1), LayerSpec(64 * KIB, 2)])
    built = image.build(cache_dir)
    pushed = push(registry.url, "example/app", built, tag="v1")

    assert pushed.digest == built.digest
    assert pushed.reference(registry.host) == f"{registry.host}/example/app@{built.digest}"
    manifest = _fetch_manifest(registry, "example/app", pushed.digest)
    assert manifest["mediaType"] == MEDIA_TYPE_MANIFEST
    assert manifest["config"]["mediaType"] == MEDIA_TYPE_CONFIG
    assert pushed.total_size_bytes == _assert_blobs_served(registry, "example/app", manifest)
    assert pushed.layer_digests == tuple(layer.digest for layer in built.layers)
    status, headers, _ = _get(registry, "/v2/example/app/manifests/v1", method="HEAD")
    assert status == 200
    assert headers["docker-content-digest"] == built.digest


def test_pushed_index_serves_every_platform(registry: Registry, cache_dir: Path) -> None:
    base = LayerSpec(64 * KIB, 10)
    platforms = [("amd64", LayerSpec(64 * KIB, 11)), ("arm64", LayerSpec(64 * KIB, 12))]
    children = [
        TestImage("example/multi", [base, top], architecture=arch).build(cache_dir)
        for arch, top in platforms
    ]
    index = build_index(children)
    pushed = push(registry.url, "example/multi", index, tag="latest")

    assert pushed.digest == index.digest
    assert pushed.child_digests == (children[0].digest, children[1].digest)
    assert len(pushed.layer_digests) == 3
    doc = _fetch_manifest(registry, "example/multi", "latest")
    assert doc["mediaType"] == MEDIA_TYPE_INDEX
    entries: list[dict[str, Any]] = doc["manifests"]
    assert [e["platform"] for e in entries] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux"},
    ]
    total = 0
    for entry, child in zip(entries, children, strict=True):
        assert entry["digest"] == child.digest
        child_doc = _fetch_manifest(registry, "example/multi", child.digest)
        total += _assert_blobs_served(registry, "example/multi", child_doc)
    # The shared base layer counts once in the pushed size.
    assert pushed.total_size_bytes == total - index.images[1].layers[0].size_bytes


def test_oci_manifests_need_an_oci_accept_header(registry: Registry, cache_dir: Path) -> None:
    # distribution 2.8 answers 404 MANIFEST_UNKNOWN, not the manifest, to clients that do
    # not list the OCI media type in Accept; real pullers (CRI-O) do list it.
    built = TestImage("example/app", [LayerSpec(KIB, 4)]).build(cache_dir)
    push(registry.url, "example/app", built)
    path = f"/v2/example/app/manifests/{built.digest}"
    status, _, body = _get(registry, path, accept="application/json")
    assert status == 404
    assert b"MANIFEST_UNKNOWN" in body
    assert _get(registry, path, accept=MEDIA_TYPE_MANIFEST)[0] == 200


def test_second_push_skips_existing_blobs(registry: Registry, cache_dir: Path) -> None:
    built = TestImage("example/app", [LayerSpec(64 * KIB, 3)]).build(cache_dir)

    def upload_count() -> int:
        return registry.log_path.read_text().count("POST /v2/example/app/blobs/uploads/")

    push(registry.url, "example/app", built)
    assert upload_count() == 2  # config and layer
    push(registry.url, "example/app", built)
    assert upload_count() == 2


def test_head_of_missing_blob_is_404(registry: Registry) -> None:
    missing = "sha256:" + "0" * 64
    status, _, _ = _get(registry, f"/v2/example/app/blobs/{missing}", method="HEAD")
    assert status == 404


def test_stop_ends_the_process_and_frees_the_port(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with registry:
        pid = registry.pid
        assert pid is not None
        assert "level: warn" in registry.config_path.read_text()
    assert registry.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConnectionRefusedError):
        _get(registry, "/v2/")


def _fake_binary(tmp_path: Path, script: str) -> str:
    path = tmp_path / "fake-registry"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_start_reports_an_early_exit_with_the_log(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "echo 'configuration error: bad things'; exit 3")
    registry = Registry(tmp_path / "registry", binary=binary)
    with pytest.raises(RegistryStartError, match=r"code 3[\s\S]*bad things"):
        registry.start()
    assert registry.pid is None


def test_start_times_out_with_the_log_tail(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "echo 'still booting'; exec sleep 60")
    registry = Registry(tmp_path / "registry", binary=binary, startup_timeout_s=0.3)
    with pytest.raises(WaitTimeout, match="still booting"):
        registry.start()
    assert registry.pid is None
