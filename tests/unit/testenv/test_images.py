"""Unit tests of the deterministic OCI test image generator (no registry, no network)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from tests.testenv import images
from tests.testenv.images import (
    MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_INDEX,
    MEDIA_TYPE_LAYER,
    MEDIA_TYPE_MANIFEST,
    LayerSpec,
    PushedImage,
    TestImage,
    assemble_image,
    build_index,
    canonical_json,
    generate_layer,
    make_image_set,
)

KIB = 1024


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _members(layer_path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer_path.read_bytes()))) as tar:
        return [
            (m, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
            for m in tar.getmembers()
        ]


def test_same_spec_gives_identical_bytes_in_independent_caches(tmp_path: Path) -> None:
    first = generate_layer(LayerSpec(64 * KIB, 42), tmp_path / "a")
    second = generate_layer(LayerSpec(64 * KIB, 42), tmp_path / "b")
    assert first.path != second.path
    assert (first.digest, first.diff_id, first.size_bytes) == (
        second.digest,
        second.diff_id,
        second.size_bytes,
    )
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.digest == _sha256(first.path.read_bytes())
    assert first.size_bytes == first.path.stat().st_size


def test_different_seeds_or_sizes_give_different_digests(cache_dir: Path) -> None:
    digests = {
        generate_layer(spec, cache_dir).digest
        for spec in [LayerSpec(64 * KIB, 1), LayerSpec(64 * KIB, 2), LayerSpec(65 * KIB, 1)]
    }
    assert len(digests) == 3


def test_diff_id_is_sha256_of_the_uncompressed_tar(cache_dir: Path) -> None:
    layer = generate_layer(LayerSpec(64 * KIB, 7), cache_dir)
    compressed = layer.path.read_bytes()
    assert layer.diff_id == _sha256(gzip.decompress(compressed))
    assert compressed[4:8] == b"\0\0\0\0", "gzip header mtime must be 0"


def test_diff_id_is_pinned_so_format_changes_are_noticed(cache_dir: Path) -> None:
    # The uncompressed tar depends only on Python's tarfile and random; if this changes,
    # bump images._FORMAT_VERSION so stale cache entries are not reused.
    layer = generate_layer(LayerSpec(1 * KIB, 1), cache_dir)
    assert layer.diff_id == (
        "sha256:929b919381a4c2ae810f28daceb7e6c4e522512346e38ef864b7532dc977d870"
    )


def test_layer_holds_seeded_random_files_without_owners_or_times(cache_dir: Path) -> None:
    layer = generate_layer(LayerSpec(64 * KIB, 9), cache_dir)
    members = _members(layer.path)
    assert [m.name for m, _ in members] == ["testenv-9", "testenv-9/data-000.bin"]
    for member, _ in members:
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0,
            0,
            0,
            "",
            "",
        )
    assert members[1][1] == random.Random(9).randbytes(64 * KIB)  # noqa: S311


def test_large_layers_are_split_into_several_files(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "_MAX_FILE_BYTES", 16 * KIB)
    layer = generate_layer(LayerSpec(40 * KIB, 3), cache_dir)
    files = [(m.name, data) for m, data in _members(layer.path) if m.isfile()]
    assert [(name, len(data)) for name, data in files] == [
        ("testenv-3/data-000.bin", 16 * KIB),
        ("testenv-3/data-001.bin", 16 * KIB),
        ("testenv-3/data-002.bin", 8 * KIB),
    ]
    assert b"".join(data for _, data in files) == random.Random(3).randbytes(40 * KIB)  # noqa: S311


def test_random_content_does_not_depend_on_read_sizes() -> None:
    size_bytes = (5 << 20) // 2  # spans several random chunks

    def read_all(read_size: int) -> bytes:
        reader = images._RandomReader(random.Random(5), size_bytes)  # noqa: S311
        return b"".join(iter(lambda: reader.read(read_size), b""))

    assert read_all(10_000) == read_all(1 << 20) == read_all(3 << 20)
    assert len(read_all(10_000)) == size_bytes


def test_cached_layer_is_not_regenerated_unless_its_blob_is_gone(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = LayerSpec(64 * KIB, 11)
    first = generate_layer(spec, cache_dir)
    real_writer = images._write_layer_tar
    calls: list[LayerSpec] = []

    def counting_writer(spec: LayerSpec, out: images._HashingWriter) -> None:
        calls.append(spec)
        real_writer(spec, out)

    monkeypatch.setattr(images, "_write_layer_tar", counting_writer)
    assert generate_layer(spec, cache_dir) == first
    assert calls == []
    first.path.unlink()
    assert generate_layer(spec, cache_dir) == first
    assert calls == [spec]
    assert first.path.is_file()
    assert not list((cache_dir / "sha256").glob(".partial-*"))


def test_manifest_and_config_are_canonical_oci_documents(cache_dir: Path) -> None:
    image = TestImage(
        "example/app", [LayerSpec(64 * KIB, 1), LayerSpec(32 * KIB, 2)], tag="v1"
    ).build(cache_dir)
    assert image.manifest.data is not None
    assert image.config.data is not None
    manifest = json.loads(image.manifest.data)
    config = json.loads(image.config.data)
    assert image.manifest.data == canonical_json(manifest)
    assert image.config.data == canonical_json(config)
    assert image.digest == _sha256(image.manifest.data)
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == MEDIA_TYPE_MANIFEST
    assert manifest["config"] == {
        "mediaType": MEDIA_TYPE_CONFIG,
        "digest": _sha256(image.config.data),
        "size": len(image.config.data),
    }
    assert manifest["layers"] == [
        {"mediaType": MEDIA_TYPE_LAYER, "digest": layer.digest, "size": layer.path.stat().st_size}
        for layer in image.layers
    ]
    assert config["architecture"] == "amd64"
    assert config["os"] == "linux"
    assert config["rootfs"] == {
        "type": "layers",
        "diff_ids": [layer.diff_id for layer in image.layers],
    }
    assert "created" not in config
    assert b" " not in image.manifest.data


def test_labels_go_into_the_config_and_no_labels_keep_it_as_before(cache_dir: Path) -> None:
    layer = generate_layer(LayerSpec(KIB, 5), cache_dir)
    platform = {"architecture": "amd64", "os": "linux"}
    labelled = assemble_image("ocp/os", None, platform, (layer,), {"ostree.bootable": "true"})
    plain = assemble_image("ocp/os", None, platform, (layer,))
    assert labelled.config.data is not None and plain.config.data is not None
    assert json.loads(labelled.config.data)["config"] == {"Labels": {"ostree.bootable": "true"}}
    assert json.loads(plain.config.data)["config"] == {}
    assert plain.digest == TestImage("ocp/os", [LayerSpec(KIB, 5)]).build(cache_dir).digest


def test_index_lists_each_platform_manifest(cache_dir: Path) -> None:
    base = LayerSpec(64 * KIB, 100)
    amd64 = TestImage("example/multi", [base, LayerSpec(KIB, 1)]).build(cache_dir)
    arm64 = TestImage(
        "example/multi", [base, LayerSpec(KIB, 2)], architecture="arm64", variant="v8"
    ).build(cache_dir)
    index = build_index([amd64, arm64], tag="latest")
    assert index.manifest.data is not None
    doc = json.loads(index.manifest.data)
    assert index.manifest.media_type == doc["mediaType"] == MEDIA_TYPE_INDEX
    assert doc["schemaVersion"] == 2
    assert doc["manifests"] == [
        {
            "mediaType": MEDIA_TYPE_MANIFEST,
            "digest": amd64.digest,
            "size": amd64.manifest.size_bytes,
            "platform": {"architecture": "amd64", "os": "linux"},
        },
        {
            "mediaType": MEDIA_TYPE_MANIFEST,
            "digest": arm64.digest,
            "size": arm64.manifest.size_bytes,
            "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
        },
    ]
    assert index.digest == _sha256(index.manifest.data)
    # The shared base layer is listed once among the index's blobs.
    layer_digests = [b.digest for b in index.blobs() if b.media_type == MEDIA_TYPE_LAYER]
    assert len(layer_digests) == len(set(layer_digests)) == 3


def test_index_needs_images_of_one_repository(cache_dir: Path) -> None:
    one = TestImage("example/one", [LayerSpec(KIB, 1)]).build(cache_dir)
    two = TestImage("example/two", [LayerSpec(KIB, 1)]).build(cache_dir)
    with pytest.raises(ValueError, match="one repository"):
        build_index([one, two])
    with pytest.raises(ValueError, match="at least one"):
        build_index([])


def test_image_set_shares_one_base_layer_generated_once(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_writer = images._write_layer_tar
    generated: list[LayerSpec] = []

    def counting_writer(spec: LayerSpec, out: images._HashingWriter) -> None:
        generated.append(spec)
        real_writer(spec, out)

    monkeypatch.setattr(images, "_write_layer_tar", counting_writer)
    specs = make_image_set(3, layer_size_bytes=16 * KIB, shared_base_size_bytes=64 * KIB, seed=5)
    built = [spec.build(cache_dir) for spec in specs]
    assert [image.repository for image in built] == [
        "example/app-0",
        "example/app-1",
        "example/app-2",
    ]
    assert len({image.layers[0].digest for image in built}) == 1
    assert len({image.layers[1].digest for image in built}) == 3
    assert len(generated) == len(set(generated)) == 4
    assert len(list((cache_dir / "sha256").iterdir())) == 4
    assert make_image_set(3, 16 * KIB, 64 * KIB, seed=5) == specs
    assert make_image_set(3, 16 * KIB, 64 * KIB, seed=6) != specs


def test_pushed_image_reference_pins_the_digest() -> None:
    pushed = PushedImage("example/app", "sha256:" + "ab" * 32, MEDIA_TYPE_MANIFEST, 10, ())
    assert pushed.reference("127.0.0.1:5000") == f"127.0.0.1:5000/example/app@sha256:{'ab' * 32}"


def test_layer_spec_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        LayerSpec(-1, 0)
