"""The contract tests/fakes/registry.py's ``FakeManifests`` shares with the real client.

The same assertions run against ``FakeManifests`` and against ``RegistryClient`` reading
the real registry through tests/testenv/faulty_proxy.py: a known image has a size, a registry
that refuses connections raises ``RegistryUnavailable``, one answering 5xx raises
``RegistryError`` (a ``RegistryUnavailable`` too), a digest the registry lacks raises
``ImageNotFound``, and every fault ends when the registry is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import pytest

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.disk import ManifestSource
from nodeagent.errors import ImageNotFound, RegistryError, RegistryUnavailable
from nodeagent.registries import Platform
from tests.conftest import Pushed
from tests.fakes.registry import FakeManifests
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration


class Side(Protocol):
    @property
    def source(self) -> ManifestSource: ...

    @property
    def ref(self) -> str: ...

    @property
    def missing(self) -> str: ...

    def down(self) -> None: ...

    def answer(self, status: int) -> None: ...

    def back(self) -> None: ...


@dataclass
class Real:
    front: FaultyProxy
    source: RegistryClient
    ref: str
    missing: str

    def down(self) -> None:
        self.front.refuse()

    def answer(self, status: int) -> None:
        self.front.answer_errors(status)

    def back(self) -> None:
        self.front.heal()
        self.source.unreachable.forget()  # a new sync: the client remembers a failure per sync


@dataclass
class Fake:
    source: FakeManifests
    ref: str
    missing: str

    def down(self) -> None:
        self.source.fail(self.ref, RegistryUnavailable("cannot reach: connection refused"))

    def answer(self, status: int) -> None:
        self.source.fail(self.ref, RegistryError(f"the registry answered HTTP {status}"))

    def back(self) -> None:
        self.source.fail(self.ref, None)


@pytest.fixture(params=["real", "fake"])
def side(request: pytest.FixtureRequest, registry: Registry, pushed: Pushed) -> Iterator[Side]:
    missing_digest = "sha256:" + "0" * 64
    if request.param == "fake":
        ref = pushed.ref(pushed.base_a)
        yield Fake(FakeManifests({ref: 1000}), ref, ref.split("@")[0] + "@" + missing_digest)
        return
    with FaultyProxy(registry.host) as front:
        client = RegistryClient(
            insecure={front.host}, platform=Platform("linux", "amd64"), timeout_s=10
        )
        ref = pushed.base_a.reference(front.host)
        yield Real(front, client, ref, ref.split("@")[0] + "@" + missing_digest)


async def test_a_known_image_has_a_size(side: Side) -> None:
    layers = await side.source.image_layers(side.ref, None)
    assert layers.ref == side.ref
    assert layers.total_size_bytes > 0


async def test_a_registry_that_refuses_connections_is_unavailable(side: Side) -> None:
    side.down()
    with pytest.raises(RegistryUnavailable) as info:
        await side.source.image_layers(side.ref, None)
    assert not isinstance(info.value, RegistryError)
    side.back()
    assert (await side.source.image_layers(side.ref, None)).total_size_bytes > 0


@pytest.mark.parametrize("status", [500, 503])
async def test_a_registry_answering_5xx_is_a_registry_error(side: Side, status: int) -> None:
    side.answer(status)
    with pytest.raises(RegistryError):
        await side.source.image_layers(side.ref, None)
    side.back()
    assert (await side.source.image_layers(side.ref, None)).total_size_bytes > 0


async def test_a_digest_the_registry_lacks_is_not_found(side: Side) -> None:
    with pytest.raises(ImageNotFound):
        await side.source.image_layers(side.missing, None)
