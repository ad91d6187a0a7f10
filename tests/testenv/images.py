"""Deterministic OCI test images, generated locally and pushed to a test registry.

Tests need real images of chosen sizes (a few KiB for unit tests, hundreds of MB for
pre-load benchmarks) without reaching the internet. This module builds them from seeds:

* a `LayerSpec(size_bytes, seed)` becomes a gzip'ed tar of random file contents. Tar and
  gzip headers carry no timestamps or owners, so the same spec always gives the same
  bytes and digests. Layers stream to a content-addressed cache on disk
  (`<cache_dir>/sha256/<hex>`), so a 300 MB layer is never held in memory and is made
  only once per machine;
* a `TestImage` becomes a `BuiltImage`: an OCI config (no `created` field) and an OCI
  manifest, both serialized canonically; `build_index` groups images into an OCI index;
* `push` uploads blobs and manifests through the distribution HTTP API (stdlib only).

Digests are stable across runs; across machines they are as stable as zlib's level-1
output (identical for the same zlib build; a different deflate implementation such as
zlib-ng could change layer digests, never diff_ids).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import os
import random
import tarfile
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, cast

from tests.testenv.crio_build import CACHE_ROOT

MEDIA_TYPE_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_TYPE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

# Bump when the byte layout of generated layers changes: it is part of the cache key.
_FORMAT_VERSION = 1
_RANDOM_CHUNK_BYTES = 1 << 20  # randbytes() granularity; part of the format
_MAX_FILE_BYTES = 64 << 20  # a layer holds ceil(size / 64 MiB) files (at least one)
_IO_CHUNK_BYTES = 1 << 20


def default_cache_dir() -> Path:
    """Where generated layer blobs are kept between runs (under NODEAGENT_TESTENV_CACHE)."""
    return CACHE_ROOT / "blobs"


def canonical_json(value: object) -> bytes:
    """Serialize JSON with sorted keys and no whitespace, so digests are reproducible."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class LayerSpec:
    """A layer of `size_bytes` bytes of random file content drawn from `seed`."""

    size_bytes: int
    seed: int

    def __post_init__(self) -> None:
        if self.size_bytes < 0 or self.seed < 0:
            raise ValueError(f"size_bytes and seed must be >= 0, got {self}")

    def cache_key(self) -> str:
        """Hex key naming this spec's cache entry (size, seed and format version)."""
        key = {"format": _FORMAT_VERSION, "seed": self.seed, "size_bytes": self.size_bytes}
        return hashlib.sha256(canonical_json(key)).hexdigest()


@dataclass(frozen=True)
class Blob:
    """A content-addressed blob, either on disk (`path`) or in memory (`data`)."""

    media_type: str
    digest: str
    size_bytes: int
    path: Path | None = None
    data: bytes | None = None

    def open(self) -> IO[bytes]:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.path is not None, "a Blob has data or a path"
        return self.path.open("rb")

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size_bytes}

    @classmethod
    def from_bytes(cls, media_type: str, data: bytes) -> Blob:
        return cls(media_type, _sha256(data), len(data), data=data)


@dataclass(frozen=True)
class GeneratedLayer:
    """A layer blob in the cache: compressed `digest`/`size_bytes`, uncompressed `diff_id`."""

    spec: LayerSpec
    digest: str
    diff_id: str
    size_bytes: int
    path: Path

    def blob(self) -> Blob:
        return Blob(MEDIA_TYPE_LAYER, self.digest, self.size_bytes, path=self.path)


class _RandomReader:
    """File-like source of `size_bytes` seeded random bytes, independent of read sizes."""

    def __init__(self, rng: random.Random, size_bytes: int) -> None:
        self._rng = rng
        self._left = size_bytes
        self._chunk = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        want = self._left + len(self._chunk) if size < 0 else size
        parts: list[bytes] = []
        while want > 0:
            if not self._chunk:
                if self._left == 0:
                    break
                take = min(_RANDOM_CHUNK_BYTES, self._left)
                self._chunk = memoryview(self._rng.randbytes(take))
                self._left -= take
            piece = self._chunk[:want]
            self._chunk = self._chunk[len(piece) :]
            parts.append(bytes(piece))
            want -= len(piece)
        return b"".join(parts)


class _HashingWriter:
    """Write-through wrapper that hashes and counts what passes through it."""

    def __init__(self, target: IO[bytes] | gzip.GzipFile) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.count += len(data)
        self._target.write(data)
        return len(data)

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self._target.flush()


def _tar_info(name: str, size_bytes: int, *, is_dir: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.size = 0 if is_dir else size_bytes
    info.mode = 0o755 if is_dir else 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_layer_tar(spec: LayerSpec, out: _HashingWriter) -> None:
    rng = random.Random(spec.seed)  # noqa: S311 - reproducible test data, not secrets
    file_count = max(1, -(-spec.size_bytes // _MAX_FILE_BYTES))
    directory = f"testenv-{spec.seed}"
    with tarfile.open(fileobj=cast(IO[bytes], out), mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_tar_info(directory, 0, is_dir=True))
        left = spec.size_bytes
        for index in range(file_count):
            size = min(_MAX_FILE_BYTES, left)
            left -= size
            info = _tar_info(f"{directory}/data-{index:03d}.bin", size)
            tar.addfile(info, _RandomReader(rng, size))


def generate_layer(spec: LayerSpec, cache_dir: Path | None = None) -> GeneratedLayer:
    """Return the cached layer for `spec`, generating it (streamed to disk) if missing."""
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    index_path = cache / "layers" / f"{spec.cache_key()}.json"
    blob_dir = cache / "sha256"
    if index_path.exists():
        entry = json.loads(index_path.read_text())
        path = blob_dir / entry["digest"].removeprefix("sha256:")
        if path.is_file() and path.stat().st_size == entry["size_bytes"]:
            return GeneratedLayer(spec, path=path, **entry)
    blob_dir.mkdir(parents=True, exist_ok=True)
    index_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=blob_dir, prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as raw:
            compressed = _HashingWriter(raw)
            with gzip.GzipFile(
                filename="", mode="wb", compresslevel=1, fileobj=compressed, mtime=0
            ) as gz:
                uncompressed = _HashingWriter(gz)
                _write_layer_tar(spec, uncompressed)
        digest = "sha256:" + compressed.sha256.hexdigest()
        path = blob_dir / compressed.sha256.hexdigest()
        Path(tmp_name).replace(path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    entry = {
        "digest": digest,
        "diff_id": "sha256:" + uncompressed.sha256.hexdigest(),
        "size_bytes": compressed.count,
    }
    fd, tmp_index = tempfile.mkstemp(dir=index_path.parent, prefix=".partial-")
    with os.fdopen(fd, "wb") as out:
        out.write(canonical_json(entry))
    Path(tmp_index).replace(index_path)
    return GeneratedLayer(spec, path=path, **entry)


# ------------------------------------------------------------------------- images


@dataclass(frozen=True)
class BuiltImage:
    """A single-platform image: config and manifest in memory, layers in the cache."""

    repository: str
    tag: str | None
    platform: dict[str, str]
    config: Blob
    layers: tuple[GeneratedLayer, ...]
    manifest: Blob

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def blobs(self) -> list[Blob]:
        """Config and layer blobs, each digest once, in manifest order."""
        unique = {b.digest: b for b in [self.config, *(layer.blob() for layer in self.layers)]}
        return list(unique.values())


@dataclass(frozen=True)
class TestImage:
    """What an image should contain; `build()` turns it into a `BuiltImage`."""

    __test__: ClassVar[bool] = False  # not a pytest test class despite the name

    repository: str
    layers: list[LayerSpec]
    architecture: str = "amd64"
    os: str = "linux"
    tag: str | None = None
    variant: str | None = None

    def platform(self) -> dict[str, str]:
        found = {"architecture": self.architecture, "os": self.os, "variant": self.variant}
        return {key: value for key, value in found.items() if value is not None}

    def build(self, cache_dir: Path | None = None) -> BuiltImage:
        layers = tuple(generate_layer(spec, cache_dir) for spec in self.layers)
        return assemble_image(self.repository, self.tag, self.platform(), layers)


def assemble_image(
    repository: str,
    tag: str | None,
    platform: dict[str, str],
    layers: tuple[GeneratedLayer, ...],
    labels: dict[str, str] | None = None,
) -> BuiltImage:
    """The config and manifest of an image made of ``layers`` for ``platform``, its config
    carrying ``labels`` (``config.Labels``) when given."""
    config_doc = {
        **platform,
        "config": {"Labels": dict(labels)} if labels else {},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }
    config = Blob.from_bytes(MEDIA_TYPE_CONFIG, canonical_json(config_doc))
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.blob().descriptor() for layer in layers],
    }
    manifest = Blob.from_bytes(MEDIA_TYPE_MANIFEST, canonical_json(manifest_doc))
    return BuiltImage(repository, tag, platform, config, layers, manifest)


@dataclass(frozen=True)
class BuiltIndex:
    """A multi-platform image: an OCI index over `images` of one repository."""

    repository: str
    tag: str | None
    images: tuple[BuiltImage, ...]
    manifest: Blob

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def blobs(self) -> list[Blob]:
        unique = {b.digest: b for image in self.images for b in image.blobs()}
        return list(unique.values())


def build_index(images: Sequence[BuiltImage], tag: str | None = None) -> BuiltIndex:
    """Group built images (one repository, typically one per platform) into an OCI index."""
    if not images:
        raise ValueError("an index needs at least one image")
    repositories = {image.repository for image in images}
    if len(repositories) != 1:
        raise ValueError(f"index images must share one repository, got {sorted(repositories)}")
    doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [{**i.manifest.descriptor(), "platform": i.platform} for i in images],
    }
    manifest = Blob.from_bytes(MEDIA_TYPE_INDEX, canonical_json(doc))
    return BuiltIndex(images[0].repository, tag, tuple(images), manifest)


def make_image_set(
    count: int, layer_size_bytes: int, shared_base_size_bytes: int, seed: int
) -> list[TestImage]:
    """`count` images `example/app-<i>` (i from 0): a shared base layer plus one unique layer."""
    base = LayerSpec(shared_base_size_bytes, _derive_seed(seed, "base"))
    return [
        TestImage(f"example/app-{i}", [base, LayerSpec(layer_size_bytes, _derive_seed(seed, i))])
        for i in range(count)
    ]


def _derive_seed(seed: int, label: object) -> int:
    digest = hashlib.sha256(f"nodeagent-testenv:{seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


# ------------------------------------------------------------------------- push


class RegistryError(Exception):
    """The registry answered a push request with an unexpected status."""

    def __init__(self, method: str, url: str, status: int, body: bytes) -> None:
        text = body.decode(errors="replace")[:500]
        super().__init__(f"{method} {url} -> HTTP {status}: {text}")
        self.status = status


@dataclass(frozen=True)
class PushedImage:
    """Where a pushed image or index lives and what it weighs."""

    repository: str
    digest: str
    media_type: str
    total_size_bytes: int
    layer_digests: tuple[str, ...]
    tag: str | None = None
    child_digests: tuple[str, ...] = field(default=())

    def reference(self, host: str) -> str:
        return f"{host}/{self.repository}@{self.digest}"


def _request(method: str, url: str, body: Blob | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection; a Blob body is streamed from its file."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=60, blocksize=_IO_CHUNK_BYTES)
    headers = {"Content-Length": "0"} if method in {"PUT", "POST"} else {}
    if body is not None:
        headers = {"Content-Type": body.media_type, "Content-Length": str(body.size_bytes)}
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        if body is None:
            conn.request(method, target, headers=headers)
        else:
            with body.open() as stream:
                conn.request(method, target, body=stream, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def _push_blob(base: str, repository: str, blob: Blob) -> None:
    blob_url = f"{base}/v2/{repository}/blobs/{blob.digest}"
    status, _, body = _request("HEAD", blob_url)
    if status == 200:
        return
    if status != 404:
        raise RegistryError("HEAD", blob_url, status, body)
    start_url = f"{base}/v2/{repository}/blobs/uploads/"
    status, headers, body = _request("POST", start_url)
    if status != 202 or "location" not in headers:
        raise RegistryError("POST", start_url, status, body)
    location = urllib.parse.urljoin(start_url, headers["location"])
    separator = "&" if urllib.parse.urlsplit(location).query else "?"
    put_url = f"{location}{separator}digest={urllib.parse.quote(blob.digest)}"
    status, headers, body = _request("PUT", put_url, blob)
    if status != 201 or headers.get("docker-content-digest") != blob.digest:
        raise RegistryError("PUT", put_url, status, body)


def _put_manifest(base: str, repository: str, manifest: Blob, reference: str) -> None:
    url = f"{base}/v2/{repository}/manifests/{reference}"
    status, headers, body = _request("PUT", url, manifest)
    if status != 201 or headers.get("docker-content-digest") != manifest.digest:
        raise RegistryError("PUT", url, status, body)


def _push_image(base: str, repository: str, image: BuiltImage) -> None:
    for blob in image.blobs():
        _push_blob(base, repository, blob)
    _put_manifest(base, repository, image.manifest, image.digest)


def push(
    registry_url: str,
    repository: str,
    built: BuiltImage | BuiltIndex,
    tag: str | None = None,
) -> PushedImage:
    """Upload `built` to `repository` at `registry_url`; tag it with `tag` or `built.tag`.

    Blobs already in the repository are skipped (HEAD); others go up as one streamed PUT.
    For an index, every child manifest is pushed by digest before the index itself.
    """
    base = registry_url.rstrip("/")
    images = built.images if isinstance(built, BuiltIndex) else (built,)
    for image in images:
        _push_image(base, repository, image)
    if isinstance(built, BuiltIndex):
        _put_manifest(base, repository, built.manifest, built.digest)
    final_tag = tag if tag is not None else built.tag
    if final_tag is not None:
        _put_manifest(base, repository, built.manifest, final_tag)
    blobs = built.blobs()
    return PushedImage(
        repository=repository,
        digest=built.digest,
        media_type=built.manifest.media_type,
        total_size_bytes=sum(blob.size_bytes for blob in blobs),
        layer_digests=tuple(b.digest for b in blobs if b.media_type == MEDIA_TYPE_LAYER),
        tag=final_tag,
        child_digests=tuple(i.digest for i in images) if isinstance(built, BuiltIndex) else (),
    )
