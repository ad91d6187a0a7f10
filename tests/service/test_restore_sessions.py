"""StoreRestorer and the mirror session it shares with the bundle importer.

Real: ``StoreRestorer``, ``serving.pull_via_mirror`` and ``MIRROR_LOCK``. Fake: the runtime
(``FakeCrio``), the store (what it holds), the loopback server and the mirror drop-in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.bundles.manifest import BundleError, ExpectedFile
from nodeagent.bundles.mirror import PROBE_REF
from nodeagent.bundles.restore import StoreRestorer
from nodeagent.bundles.serving import MIRROR_LOCK, BundleServerPort, MirrorPullPorts
from nodeagent.bundles.signatures import AttachmentScopes
from nodeagent.bundles.tags import ServedTag
from nodeagent.errors import ImageNotFound, RegistryUnavailable
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import normalize_registry
from tests.fakes.crio import FakeCrio

A = "quay.io/ns/app-a@sha256:" + "a" * 64
B = "quay.io/ns/app-b@sha256:" + "b" * 64


@dataclass(frozen=True)
class Found:
    refs: tuple[str, ...]
    files: dict[str, ExpectedFile] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    served: tuple[ServedTag, ...] = ()


class HeldStore:
    root = Path("/store")

    def __init__(self, *refs: str) -> None:
        self.held = refs

    def restorable(self, refs: Sequence[str]) -> Found:
        return Found(tuple(ref for ref in refs if ref in self.held))


class Server:
    mirror_host = "127.0.0.1:5000"
    rejections: tuple[BundleError, ...] = ()

    def __init__(self) -> None:
        self.is_closed = False
        self.requests = 0

    def bytes_served(self) -> int:
        return 0

    def requests_seen(self) -> int:
        return self.requests

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.is_closed = True


class Mirror:
    def __init__(self) -> None:
        self.writes = 0

    def write(
        self, repositories: Iterable[str], mirror_host: str, *, tagged: Iterable[str] = ()
    ) -> bool:
        self.writes += 1
        return True

    def remove(self) -> bool:
        return self.writes > 0


class Reloader:
    async def reload(self) -> str:
        return "sighup"


def restorer(
    crio: FakeCrio, mirror: Mirror, servers: list[Server], *, is_probing: bool = False
) -> StoreRestorer:
    def make_server(_root: Path, _files: Mapping[str, ExpectedFile]) -> BundleServerPort:
        servers.append(Server())
        return servers[-1]

    session = MirrorPullPorts(
        crio,
        mirror,
        Reloader(),
        lambda: PrePuller(crio, lambda _ref: None, PullPolicy(attempts=1)),
        is_probing=is_probing,
    )
    return StoreRestorer(HeldStore(A, B), make_server, session)


async def test_images_another_session_brought_back_meanwhile_are_not_pulled_again() -> None:
    """The importer held the mirror while the sync asked the store: once the restore gets
    the lock, what the import brought back is not pulled a second time."""
    crio, mirror, servers = FakeCrio(), Mirror(), list[Server]()
    restoring = restorer(crio, mirror, servers)
    async with MIRROR_LOCK:  # a bundle import's session
        waiting = asyncio.create_task(restoring.restore([A, B]))
        await asyncio.sleep(0)
        crio.store(A)  # the import pulled A
    results = await waiting

    assert crio.pull_calls == [B]
    assert list(results) == [B] and results[B].is_pulled
    assert all(server.is_closed for server in servers)


async def test_nothing_left_to_restore_writes_no_mirror() -> None:
    crio, mirror, servers = FakeCrio(), Mirror(), list[Server]()
    restoring = restorer(crio, mirror, servers)
    async with MIRROR_LOCK:
        waiting = asyncio.create_task(restoring.restore([A, B]))
        await asyncio.sleep(0)
        crio.store(A)
        crio.store(B)
    results = await waiting

    assert results == {}
    assert crio.pull_calls == []
    assert mirror.writes == 0
    assert [server.is_closed for server in servers] == [True]


async def test_no_image_is_pulled_before_a_probe_pull_reached_the_server() -> None:
    """The runtime applies the mirror only at the third probe (a reload is a signal, and
    it comes late): until then no image pull starts, so none goes to its own registry."""
    servers: list[Server] = []
    probes: list[bool] = []
    confirmed_at_pull: list[bool] = []

    async def pull(ref: str) -> None:
        if ref == PROBE_REF:
            probes.append(True)
            if len(probes) >= 3:  # through the mirror: the server answers 404
                servers[-1].requests += 1
                raise ImageNotFound("manifest unknown")
            raise RegistryUnavailable("127.0.0.1:1: connection refused")
        confirmed_at_pull.append(servers[-1].requests > 0)

    crio, mirror = FakeCrio(pull=pull), Mirror()
    results = await restorer(crio, mirror, servers, is_probing=True).restore([A, B])

    assert len(probes) == 3
    assert confirmed_at_pull == [True, True]
    assert sorted(results) == [A, B] and all(r.is_pulled for r in results.values())
    assert PROBE_REF not in {n for i in crio.images.values() for n in i.names}


class SignedStore(HeldStore):
    def restorable(self, refs: Sequence[str]) -> Found:
        return Found(tuple(ref for ref in refs if ref in self.held), tags={"ns/app-a/t": "d"})


class Attachments:
    """registries.d: what the session wrote and removed, in order."""

    directory = "/etc/containers/registries.d"

    def __init__(self) -> None:
        self.events: list[str] = []

    def scopes(self) -> AttachmentScopes:
        return AttachmentScopes()

    def write_mirror(self, mirror_host: str) -> bool:
        self.events.append(f"write {mirror_host}")
        return True

    def remove_mirror(self) -> bool:
        self.events.append("remove")
        return True


async def test_stored_signatures_are_served_and_read_through_the_mirror() -> None:
    """Images of a bundle with image signatures come back from a server that answers their
    tags, with the registries.d drop-in for the mirror written for the session only."""
    crio, mirror, attachments = FakeCrio(), Mirror(), Attachments()
    served_tags: list[Mapping[str, str]] = []

    def make_signed(
        _root: Path, _files: Mapping[str, ExpectedFile], tags: Mapping[str, str]
    ) -> BundleServerPort:
        served_tags.append(tags)
        return Server()

    def unsigned(_root: Path, _files: Mapping[str, ExpectedFile]) -> BundleServerPort:
        raise AssertionError("a signed store must be served with its tags")

    session = MirrorPullPorts(
        crio, mirror, Reloader(), lambda: PrePuller(crio, lambda _ref: None, PullPolicy())
    )
    restoring = StoreRestorer(
        SignedStore(A), unsigned, session, make_signed_server=make_signed, sigstore=attachments
    )
    results = await restoring.restore([A])

    assert results[A].is_pulled
    assert served_tags == [{"ns/app-a/t": "d"}]
    assert attachments.events == ["write 127.0.0.1:5000", "remove"]


class TaggedStore(HeldStore):
    """Holds A, whose stored bundle serves the tag ``v1`` of its repository."""

    def restorable(self, refs: Sequence[str]) -> Found:
        served = (ServedTag(parse_pinned_image_ref(A), "v1"),)
        return Found(tuple(ref for ref in refs if ref in self.held), served=served)


class TaggingMirror(Mirror):
    def __init__(self) -> None:
        super().__init__()
        self.tagged: list[tuple[str, ...]] = []

    def write(
        self, repositories: Iterable[str], mirror_host: str, *, tagged: Iterable[str] = ()
    ) -> bool:
        self.tagged.append(tuple(tagged))
        return super().write(repositories, mirror_host)


async def test_a_restored_image_gets_its_served_tag_back() -> None:
    """After a storage wipe the image comes back by digest; the tag its bundle serves is
    pulled again through the mirror's tag-only entry, as at import."""
    crio, mirror, servers = FakeCrio(), TaggingMirror(), list[Server]()
    base = restorer(crio, mirror, servers)
    restoring = StoreRestorer(TaggedStore(A), base.make_server, base.session)
    results = await restoring.restore([A])
    assert all(server.is_closed for server in servers)
    ref = parse_pinned_image_ref(A)
    assert list(results) == [A] and results[A].is_pulled
    assert crio.pull_calls == [A, f"{ref.name}:v1"]
    assert mirror.tagged == [(f"{normalize_registry(ref.host)}/{ref.repository}",)]
