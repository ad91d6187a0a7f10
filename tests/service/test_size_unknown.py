"""Disk admission never counts unknown as zero (issue 13).

An image whose manifest cannot be read (the registry down or answering 5xx, nothing
cached) holds its set back: nothing of it is pulled, the set says ``SizeUnknown`` and
each image's cause; other sets go on. Admission's inputs and decisions are logged.
"""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from nodeagent.errors import RegistryError, RegistryUnavailable
from tests.service.pin_node import GIB, MIB, A, B, C, Node, by_name


async def test_a_set_with_an_image_of_unknown_size_is_held_and_nothing_of_it_pulled(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    node.manifests.fail(B, RegistryError("the registry answered HTTP 500"))
    node.write_set("apps", A)
    node.write_set("web", B, C)

    with capture_logs() as logs:
        status = await node.sync()

    web = by_name(status)["web"]
    assert (web.state, web.reason) == ("Degraded", "SizeUnknown")
    assert [(f.ref, f.reason) for f in web.failures] == [(B, "RegistryError")]
    assert "never counts as zero" in (web.last_failed_error or "")
    assert by_name(status)["apps"].state == "Pinned"
    assert sorted(node.crio.pull_calls) == [A]  # neither B nor C: the set is held whole
    admission = next(e for e in logs if e["event"] == "disk_admission")
    assert admission["unsized"] == ["web"]
    assert admission["admitted"] == ["apps"]
    assert admission["available_bytes"] == 50 * GIB
    assert admission["to_pull_bytes"] == {"apps": MIB + 1000}
    unknown = [e for e in logs if e["event"] == "disk_size_unknown"]
    assert [(e["set"], e["reason"], e["log_level"]) for e in unknown] == [
        ("web", "SizeUnknown", "warning")
    ]

    node.manifests.fail(B, None)  # the registry is back
    status = await node.sync()
    assert by_name(status)["web"].state == "Pinned"
    assert node.pinned() == {A, B, C}


async def test_an_unknown_size_never_fills_the_disk(tmp_path: Path) -> None:
    """The fault seen: 64 MiB of store, manifests unreadable, images pulled as "0 B"."""
    node = Node(tmp_path, available_bytes=GIB + 3 * MIB)  # room for A only, above the reserve
    node.manifests.sizes[B] = 512 * MIB
    node.manifests.fail(B, RegistryUnavailable("connection refused"))
    node.write_set("big", B)
    node.write_set("small", A)
    status = await node.sync()
    assert by_name(status)["big"].reason == "SizeUnknown"
    assert node.crio.pull_calls == [A]
    assert status.disk is not None
    assert status.disk.needed_bytes == 2 * (MIB + 1000)

    node.manifests.fail(B, None)  # sized now: too big, refused rather than pulled
    status = await node.sync()
    assert (by_name(status)["big"].state, by_name(status)["big"].reason) == (
        "Refused",
        "InsufficientDiskSpace",
    )
    assert node.crio.pull_calls == [A]


async def test_the_interim_status_shows_the_hold_while_other_sets_pull(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.manifests.fail(B, RegistryUnavailable("connection refused"))
    node.write_set("apps", A)
    node.write_set("web", B)
    seen = []

    async def pull(_image: str) -> None:
        seen.append(node.status_file())

    node.crio.pull_handler = pull
    await node.sync()
    web = next(s for s in seen[0]["pinnedImageSets"] if s["name"] == "web")
    assert (web["state"], web["reason"]) == ("Degraded", "SizeUnknown")
    assert web["failedImages"][0]["reason"] == "RegistryUnavailable"
