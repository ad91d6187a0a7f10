"""``RegistryClient.fetch_to`` through registries.conf's mirrors, against the real registry
behind two fault-injecting proxies (one plays the mirror, one the image's own registry).

A mirror that fails before any of a blob's bytes were written leaves the blob to the next
source; one that fails after that fails the fetch (the bytes written cannot be taken back),
and the source is not asked for that blob.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.registry.mirrors import routes_of
from nodeagent.adapters.registry.transport import DOWNLOAD_CHUNK_BYTES
from nodeagent.errors import RegistryUnavailable
from tests.conftest import Pushed
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import LayerSpec, PushedImage, TestImage, push
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration

MAX = 8 << 20


@pytest.fixture(scope="module")
def big(registry: Registry) -> PushedImage:
    """One image whose layer (random, so as large compressed) spans three download pieces."""
    built = TestImage("mirror-fetch/big", [LayerSpec(DOWNLOAD_CHUNK_BYTES * 5 // 2, 77)]).build()
    return push(registry.url, built.repository, built)


@pytest.fixture
def proxies(pushed: Pushed) -> Iterator[tuple[FaultyProxy, FaultyProxy]]:
    with FaultyProxy(pushed.host) as mirror, FaultyProxy(pushed.host) as source:
        yield mirror, source


def _client(mirror: FaultyProxy, source: FaultyProxy) -> RegistryClient:
    conf = (
        f'[[registry]]\nlocation = "{source.host}"\n'
        f'[[registry.mirror]]\nlocation = "{mirror.host}"\n'
    )
    return RegistryClient(
        insecure={mirror.host, source.host},
        timeout_s=1.0,
        routes=lambda: routes_of([("registries.conf", conf)]),
    )


def _blob_gets(proxy: FaultyProxy, digest: str) -> int:
    return sum(1 for e in proxy.exchanges() if e.request.is_blob and digest in e.request.path)


async def test_a_blob_the_mirror_refuses_before_its_first_byte_comes_from_the_source(
    pushed: Pushed, proxies: tuple[FaultyProxy, FaultyProxy]
) -> None:
    mirror, source = proxies
    image = pushed.base_a
    ref = image.reference(source.host)
    digest = image.layer_digests[-1]
    mirror.answer_errors(500, match=lambda r: r.is_blob)
    target = io.BytesIO()
    with capture_logs() as logs:
        fetched = await _client(mirror, source).fetch_to(ref, digest, target, max_bytes=MAX)
    assert fetched.digest == digest and len(target.getvalue()) == fetched.size_bytes > 0
    assert (_blob_gets(mirror, digest), _blob_gets(source, digest)) == (1, 1)
    assert [e["reason"] for e in logs if e["event"] == "mirror_unusable"] == ["RegistryError"]


async def test_a_blob_the_mirror_stops_sending_midway_is_not_asked_of_the_source(
    big: PushedImage, proxies: tuple[FaultyProxy, FaultyProxy]
) -> None:
    """The body is written in pieces of ``DOWNLOAD_CHUNK_BYTES``: the mirror stops after one
    and a half, so one piece is in the target when the read times out."""
    mirror, source = proxies
    ref = big.reference(source.host)
    digest = big.layer_digests[0]
    mirror.stall_bodies(after_bytes=DOWNLOAD_CHUNK_BYTES * 3 // 2)
    target = io.BytesIO()
    with pytest.raises(RegistryUnavailable, match=mirror.host):
        await _client(mirror, source).fetch_to(ref, digest, target, max_bytes=MAX)
    assert len(target.getvalue()) == DOWNLOAD_CHUNK_BYTES  # written before the mirror stopped
    assert (_blob_gets(mirror, digest), _blob_gets(source, digest)) == (1, 0)
