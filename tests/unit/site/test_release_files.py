"""A release bundle's signature files between peers, pure side: the route that names one
(never a path of the request), the check of each file, the fetch over a recorded client."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from nodeagent.bundles.mirror import ErrorAnswer
from nodeagent.errors import BundleFetchFailed, NodeAgentError, PeerAnswerInvalid, PeerUnreachable
from nodeagent.site.release_files import checked_all, fetch_release_files, release_files
from nodeagent.site.routes import PeerTarget, route_peer
from tests.unit.bundles.test_release import SIG_PATH, release_manifest

SIGNATURE = b"a release signature" * 10
BASE = "/nodeagent/v1/bundles/release-4.16.3"


def manifest(data: bytes = SIGNATURE) -> BundleManifest:
    sha = hashlib.sha256(data).hexdigest()
    doc = release_manifest()
    doc["release"]["signatures"][0] |= {"sizeBytes": len(data), "sha256": sha}
    doc["files"][2] |= {"sizeBytes": len(data), "sha256": sha}
    return parse_manifest(json.dumps(doc).encode())


def test_a_release_signature_route_names_only_its_file() -> None:
    target = route_peer("GET", f"{BASE}/{SIG_PATH}")
    assert target == PeerTarget("release-signature", bundle_id="release-4.16.3", file=SIG_PATH)
    name = SIG_PATH.rpartition("/")[2]
    for path in (
        f"{BASE}/release-signatures/../bundle.json",
        f"{BASE}/release-signatures/%2e%2e",
        f"{BASE}/release-signatures/{name}/x",
        f"{BASE}/release-signatures/{name}0000",
        f"{BASE}/release-signatures/{name.rpartition('-')[0]}-0",
        f"{BASE}/release-signatures/sha256-{'A' * 64}-1",
        f"/nodeagent/v1/bundles/..%2fx/{SIG_PATH}",
    ):
        assert isinstance(route_peer("GET", path), ErrorAnswer), path
    assert isinstance(route_peer("PUT", f"{BASE}/{SIG_PATH}"), ErrorAnswer)


def test_only_the_listed_files_with_their_size_and_sha256_pass() -> None:
    found = manifest()
    (expected,) = release_files(found)
    assert (expected.path, expected.size_bytes) == (SIG_PATH, len(SIGNATURE))
    assert checked_all(found, {SIG_PATH: SIGNATURE}) == {SIG_PATH: SIGNATURE}
    for files in (
        {SIG_PATH: SIGNATURE[:-1] + b"X"},  # same size, other bytes
        {SIG_PATH: SIGNATURE + b"\n"},
        {},
        {SIG_PATH: SIGNATURE, "release-signatures/other": b""},
    ):
        with pytest.raises(PeerAnswerInvalid):
            checked_all(found, files)


class Client:
    """Answers per peer: bytes, or an error raised."""

    def __init__(self, answers: dict[str, bytes | NodeAgentError]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, int]] = []

    async def signature_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes | None:
        raise AssertionError("not asked")

    async def bundle_file(self, address: str, bundle_id: str, name: str, max_bytes: int) -> bytes:
        self.asked.append((address, name, max_bytes))
        answer = self.answers[address]
        if isinstance(answer, NodeAgentError):
            raise answer
        return answer

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the release files fetch called {name}")


async def test_a_peer_that_lies_or_fails_is_not_asked_again() -> None:
    client = Client({"liar": SIGNATURE[::-1], "down": PeerUnreachable("no"), "good": SIGNATURE})
    found = await fetch_release_files(client, manifest(), ["liar", "down", "good"])
    assert found == {SIG_PATH: SIGNATURE}
    assert client.asked == [(p, SIG_PATH, len(SIGNATURE)) for p in ("liar", "down", "good")]


async def test_no_honest_peer_is_no_peer_left() -> None:
    client = Client({"liar": b"x" * len(SIGNATURE)})
    with pytest.raises(BundleFetchFailed):
        await fetch_release_files(client, manifest(), ["liar"])


async def test_a_bundle_without_a_release_asks_nothing() -> None:
    doc = release_manifest()
    del doc["release"]
    client = Client({})
    assert await fetch_release_files(client, parse_manifest(json.dumps(doc).encode()), ["a"]) == {}
    assert client.asked == []
