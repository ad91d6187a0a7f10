"""``bundles.arrivals.ArrivalGate``: an image's pull waits until every blob it needs is
stored (decision 0081), walking its manifests as they arrive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from nodeagent.bundles.arrivals import ArrivalGate
from nodeagent.errors import HostFileError
from nodeagent.prepull import Held
from nodeagent.registries import Platform

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
AMD64 = Platform("linux", "amd64")


def digest(char: str) -> str:
    return "sha256:" + char * 64


def descriptor(char: str, **extra: Any) -> dict[str, Any]:
    return {"mediaType": "application/octet-stream", "digest": digest(char), "size": 10} | extra


def image(config: str, *layers: str) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor(config),
        "layers": [descriptor(layer) for layer in layers],
    }).encode()  # fmt: skip


def index(**by_arch: str) -> bytes:
    entries = [descriptor(char, mediaType=OCI_MANIFEST,
                          platform={"os": "linux", "architecture": arch})
               for arch, char in by_arch.items()]  # fmt: skip
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()


class Store:
    """``StoredBlobs`` over a dict; ``failing`` digests raise as an unreadable disk would."""

    def __init__(self, bodies: dict[str, bytes], held: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.bodies = bodies
        self.held = set(held)
        self.failing: set[str] = set()

    def has_blob(self, digest: str) -> bool:
        if digest in self.failing:
            raise HostFileError(f"cannot inspect {digest}: EIO")
        return digest in self.held

    def read_manifest(self, digest: str) -> bytes | None:
        return self.bodies.get(digest) if digest in self.held else None


async def direct(function: Callable[[str], object], digest: str) -> object:
    return function(digest)


def gate(store: Store, platform: Platform | None = AMD64) -> ArrivalGate:
    return ArrivalGate(store, platform, run_blocking=direct)


def arrive(store: Store, gate: ArrivalGate, *chars: str) -> None:
    for char in chars:
        store.held.add(digest(char))
        gate.stored(digest(char))


async def settled(task: asyncio.Task[Held | None]) -> bool:
    for _ in range(5):
        await asyncio.sleep(0)
    return task.done()


REF = "quay.io/acme/app@" + digest("a")


async def test_an_image_is_ready_once_its_manifest_config_and_layers_are_stored() -> None:
    store = Store({digest("a"): image("c", "1", "2")})
    arrivals = gate(store)
    waiting = asyncio.create_task(arrivals.ready(REF))
    arrive(store, arrivals, "a", "c", "1")
    assert not await settled(waiting)
    arrive(store, arrivals, "2")
    assert await settled(waiting) and waiting.result() is None
    assert arrivals.arrived == {digest(c) for c in "ac12"}


async def test_an_index_waits_for_the_node_s_entry_only() -> None:
    store = Store({digest("a"): index(amd64="e", arm64="f"), digest("e"): image("c", "1"),
                   digest("f"): image("d", "2")})  # fmt: skip
    arrivals = gate(store)
    waiting = asyncio.create_task(arrivals.ready(REF))
    arrive(store, arrivals, "a", "e", "c")
    assert not await settled(waiting)
    arrive(store, arrivals, "1")  # the arm64 image's blobs never come
    assert await settled(waiting) and waiting.result() is None


async def test_without_a_platform_every_entry_of_an_index_is_waited_for() -> None:
    store = Store({digest("a"): index(amd64="e", arm64="f"), digest("e"): image("c", "1"),
                   digest("f"): image("d", "2")})  # fmt: skip
    arrivals = gate(store, platform=None)
    waiting = asyncio.create_task(arrivals.ready(REF))
    arrive(store, arrivals, "a", "e", "c", "1")
    assert not await settled(waiting)
    arrive(store, arrivals, "f", "d", "2")
    assert await settled(waiting) and waiting.result() is None


async def test_blobs_stored_before_the_copy_count_at_once() -> None:
    store = Store({digest("a"): image("c", "1")}, held={digest(c) for c in "ac1"})
    assert await gate(store).ready(REF) is None


async def test_a_refused_copy_holds_back_every_waiting_image_with_its_reason() -> None:
    store = Store({digest("a"): image("c", "1")})
    arrivals = gate(store)
    waiting = asyncio.create_task(arrivals.ready(REF))
    arrive(store, arrivals, "a", "c")
    assert not await settled(waiting)
    refusal = Held("BundleDigestMismatch", "blobs/sha256/11… does not match bundle.json")
    arrivals.end(refusal)
    assert await settled(waiting) and waiting.result() == refusal
    assert await arrivals.ready("quay.io/acme/other@" + digest("0")) == refusal


async def test_a_copy_ended_whole_lets_every_image_start() -> None:
    """An image whose blob the bundle does not carry (an index entry nodeagent could not
    tell) is not held forever: once the copy is whole, the runtime's pull says the rest."""
    store = Store({digest("a"): image("c", "9")})
    arrivals = gate(store)
    waiting = asyncio.create_task(arrivals.ready(REF))
    arrive(store, arrivals, "a", "c")
    assert not await settled(waiting)
    arrivals.end(None)
    assert await settled(waiting) and waiting.result() is None


async def test_what_is_not_a_manifest_or_cannot_be_read_ends_the_walk_there() -> None:
    store = Store({digest("a"): b'{"schemaVersion": 2, "layers": NaN}'}, held={digest("a")})
    assert await gate(store).ready(REF) is None  # the runtime's pull finds it wrong
    failing = Store({})
    failing.failing.add(digest("a"))
    assert await gate(failing).ready(REF) is None  # the store cannot tell: the pull runs


async def test_an_index_with_no_entry_for_the_node_is_left_to_the_runtime() -> None:
    store = Store({digest("a"): index(arm64="f")}, held={digest("a")})
    assert await gate(store).ready(REF) is None
