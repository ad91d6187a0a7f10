"""Fuzz: what a registry answers: ``WWW-Authenticate`` challenges, ``Retry-After``, token
answers, manifests and indexes (``registries``), and the manifest cache's files.

Contract: a value, or a ``NodeAgentError`` (``ImageNotFound``, ``RegistryUnavailable``, …)
with a clipped message, within the CPU bound; lifetimes and delays are finite. Each harness
calls one function by its current name (they may move to nodeagent/strict/http.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.registries import (
    ImageManifest,
    ManifestIndex,
    Platform,
    parse_manifest,
    pick_challenge,
    retry_after_s,
    select_platform,
)
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

_REF = "quay.io/openshift/app@sha256:" + "0" * 64
_DIGEST = "sha256:" + "a" * 64
_AMD64 = Platform("linux", "amd64", "")

challenges = st.one_of(
    s.text,
    s.edited_text(['Bearer realm="https://auth.example.com/token",service="reg",scope="x:y:pull"',
                   'Basic realm="registry"']),
    st.builds(lambda param, n: "Bearer " + param * n,
              st.sampled_from(['a="', "a=b,", 'realm="\\', " ", 'x="\\"', ",", "a"]),
              st.integers(1000, 40_000)),
)  # fmt: skip


@given(challenges)
@example("Bearer " + "a" * 40_000)  # ~13 s of CPU with the regexp parser it replaced
@example("Bearer " + 'a="' * 20_000)
def test_challenge(header: str) -> None:
    outcome(
        "registries.pick_challenge",
        lambda: pick_challenge(header, ref=_REF, host="quay.io"),
    )


@given(st.one_of(s.number_texts, s.text))
@example("1e999")
@example("inf")
def test_retry_after(value: str) -> None:
    result = outcome(
        "registries.retry_after_s",
        lambda: retry_after_s({"retry-after": value}, now_s=1.8e9),
        allowed=(),
    )
    assert result is None or (isinstance(result, float) and math.isfinite(result) and result >= 0)


token_answers = st.one_of(
    s.raw_bytes,
    s.json_bytes(st.fixed_dictionaries({}, optional={
        "token": s.json_like, "access_token": s.json_like,
        "expires_in": st.one_of(s.json_like, s.big_numbers), "issued_at": s.json_like,
    })),
    s.deep("[", "]", st.integers(900, 100_000)).map(str.encode),
)  # fmt: skip


@given(token_answers)
@example(b'{"token": "t", "expires_in": "nan"}')
@example(b'{"token": "t", "expires_in": ' + b"9" * 400 + b"}")
@example(b"[" * 100_000 + b"]" * 100_000)
def test_token_answer(body: bytes) -> None:
    client = RegistryClient(clock=lambda: 0.0)
    result = outcome(
        "registry token answer",
        lambda: client._parse_token(_REF, body),  # the method behind _fetch_token
    )
    if not isinstance(result, BaseException):
        assert math.isfinite(result.expires_at_s)
        assert result.expires_at_s >= 0


_IMAGE: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _DIGEST,
               "size": 100},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _DIGEST,
                "size": 1000}],
}  # fmt: skip
_INDEX: dict[str, Any] = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{"digest": _DIGEST, "size": 500,
                   "platform": {"os": "linux", "architecture": "amd64"}}],
}  # fmt: skip
_PATHS: list[tuple[str | int, ...]] = [
    ("mediaType",), ("config",), ("config", "size"), ("config", "digest"), ("layers",),
    ("layers", 0), ("layers", 0, "size"), ("layers", 0, "digest"), ("manifests",),
    ("manifests", 0), ("manifests", 0, "platform"), ("manifests", 0, "platform", "os"),
    ("manifests", 0, "digest"),
]  # fmt: skip
manifests = st.one_of(
    st.sampled_from([_IMAGE, _INDEX]),
    st.builds(
        lambda base, path, value: s.replaced(base, path[:1] if path[0] not in base else path,
                                             value),
        st.sampled_from([_IMAGE, _INDEX]), st.sampled_from(_PATHS), s.json_like,
    ),
).map(lambda doc: json.dumps(doc).encode())  # fmt: skip
content_types = st.sampled_from(
    ["", "application/vnd.oci.image.index.v1+json", "application/json; charset=utf-8",
     "application/vnd.docker.distribution.manifest.v2+json", "text/html"]
)  # fmt: skip


def _manifest(body: bytes, content_type: str) -> None:
    result = outcome(
        "registries.parse_manifest", lambda: parse_manifest(body, content_type, ref=_REF)
    )
    if isinstance(result, ManifestIndex):
        outcome("registries.parse_manifest", lambda: select_platform(result, _AMD64, ref=_REF))
    elif isinstance(result, ImageManifest):
        assert result.config_size_bytes >= 0
        assert all(size >= 0 for _, size in result.layers)


@given(st.one_of(s.raw_bytes, s.mutated(manifests)), content_types)
@example(
    b'{"layers": [], "config": {"digest": "x", "size": 1}, "mediaType": ' + b'"\x1b' * 5000 + b'"}',
    "",
)
@example(b"[" * 100_000 + b"]" * 100_000, "")
@example(b'{"layers": [], "config": {"digest": "d", "size": "' + b"x" * 3000 + b'"}}', "")
def test_manifest(body: bytes, content_type: str) -> None:
    _manifest(body, content_type)


@given(manifests, content_types)
@example(json.dumps(s.replaced(_IMAGE, ("config", "size"), "x" * 3000)).encode(), "")
def test_manifest_documents(body: bytes, content_type: str) -> None:
    _manifest(body, content_type)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fuzz-cache")


cache_entries = st.one_of(
    s.raw_bytes,
    s.mutated(st.sampled_from([
        b'{"config_size_bytes": 10, "layers": [["sha256:' + b"a" * 64 + b'", 5]]}',
        b'{"child": "sha256:' + b"b" * 64 + b'"}',
    ])),
    s.json_bytes(st.fixed_dictionaries({}, optional={
        "config_size_bytes": s.json_like, "layers": s.json_like, "child": s.json_like})),
    s.deep("[", "]", st.integers(900, 100_000)).map(str.encode),
)  # fmt: skip


@given(cache_entries)
@example(b"[" * 100_000 + b"]" * 100_000)
@example(b'{"config_size_bytes": -5, "layers": []}')
@example(b'{"config_size_bytes": 1e999, "layers": []}')
@example(b'{"config_size_bytes": 1, "layers": {"ab": 1}}')
def test_manifest_cache_entry(cache_dir: Path, data: bytes) -> None:
    (cache_dir / f"{_DIGEST.replace(':', '-')}.json").write_bytes(data)
    result = outcome(
        "registry.ManifestCache entry", lambda: ManifestCache(cache_dir).get(_DIGEST, _AMD64)
    )
    if isinstance(result, ImageManifest):
        assert result.config_size_bytes >= 0
        assert all(size >= 0 for _, size in result.layers)
    for leftover in cache_dir.iterdir():  # damaged entries are set aside
        leftover.unlink()


# Sizes as the manifest parser lets them through (0 .. 2^53-1, JSON's exact integers).
@given(
    st.integers(0, 2**53 - 1), st.lists(st.tuples(st.text("0123456789abcdef", min_size=64,
                                                         max_size=64), st.integers(0, 2**53 - 1)))
)  # fmt: skip
def test_manifest_cache_round_trip(
    cache_dir: Path, config_size: int, layers: list[tuple[str, int]]
) -> None:
    """What the cache writes, a later process reads back unchanged (never pending)."""
    manifest = ImageManifest(config_size, tuple((f"sha256:{hex_}", size) for hex_, size in layers))
    ManifestCache(cache_dir).put_image(_DIGEST, manifest)
    result = outcome(
        "registry.ManifestCache entry", lambda: ManifestCache(cache_dir).get(_DIGEST, _AMD64)
    )
    assert result == manifest
    for leftover in cache_dir.iterdir():
        leftover.unlink()
