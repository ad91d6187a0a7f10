"""Transient faults are retried on a schedule that matches them (issue 13).

A set that failed for a transient cause (the registry unreachable or answering 5xx, the
runtime down, a stalled pull, a size not known yet for one of those) is synced again
after 5, 10, 20 … up to 60 s, forever, not at the 10-minute resync; meanwhile the status
names the real cause. Permanent failures wait for the resync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from nodeagent.errors import (
    ImageNotFound,
    RegistryError,
    RegistryUnavailable,
    RuntimeDoesNotPin,
    RuntimeUnreachable,
)
from nodeagent.ports import RuntimeVersion
from tests.fakes.crio import FakeCrio
from tests.service.pin_node import A, B, LoopClock, Node, by_name, condition


def statuses_between(node_box: list[Node], seen: list[dict[str, Any]]) -> LoopClock:
    """A loop clock that records status.json before each wait returns."""
    return LoopClock(park_after=99, between=lambda _i: seen.append(node_box[0].status_file()))


async def test_registry_5xx_is_retried_within_seconds_and_the_status_names_it(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    box: list[Node] = []
    loop = statuses_between(box, seen)
    loop.park_after = 3
    node = Node(tmp_path, loop=loop, failing={A: [RegistryError("HTTP 500")] * 4})
    box.append(node)
    node.write_set("apps", A)

    with capture_logs() as logs:
        await node.run_until_parked()

    assert loop.waits == [5.0, 10.0, 600.0]
    first = seen[0]
    apps = first["pinnedImageSets"][0]
    assert (apps["state"], apps["reason"]) == ("Degraded", "RegistryError")
    assert apps["failedImages"][0]["reason"] == "RegistryError"
    assert first["retryInSeconds"] == 5.0
    degraded = next(c for c in first["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RegistryError")
    assert seen[1]["retryInSeconds"] == 10.0
    assert node.pinned() == {A}
    scheduled = [e for e in logs if e["event"] == "sync_retry_scheduled"]
    assert [(e["reason"], e["retry_in_s"], e["sets"]) for e in scheduled] == [
        ("RegistryError", 5.0, ["apps"]),
        ("RegistryError", 10.0, ["apps"]),
    ]


async def test_transient_retries_go_on_forever_at_a_minute(tmp_path: Path) -> None:
    loop = LoopClock(park_after=9)
    node = Node(tmp_path, loop=loop, failing={A: [RegistryUnavailable("refused")] * 100})
    node.write_set("apps", A)
    await node.run_until_parked()
    assert loop.waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0, 60.0]


async def test_the_backoff_starts_over_once_the_cause_is_gone(tmp_path: Path) -> None:
    node_box: list[Node] = []

    def between(index: int) -> None:
        if index == 3:  # after the good sync's resync wait: the registry fails again
            node_box[0].failing[B] = [RegistryUnavailable("refused")] * 2
            node_box[0].write_set("web", B)

    loop = LoopClock(park_after=5, between=between)
    node = Node(tmp_path, loop=loop, failing={A: [RegistryUnavailable("refused")] * 4})
    node_box.append(node)
    node.write_set("apps", A)
    await node.run_until_parked()
    assert loop.waits == [5.0, 10.0, 600.0, 5.0, 600.0]


async def test_a_permanent_failure_waits_for_the_resync(tmp_path: Path) -> None:
    loop = LoopClock(park_after=2)
    node = Node(tmp_path, loop=loop, failing={A: [ImageNotFound("gone")] * 10})
    node.write_set("apps", A)
    await node.run_until_parked()
    assert loop.waits == [600.0, 600.0]
    assert "retryInSeconds" not in node.status_file()


async def test_a_size_unknown_for_a_transient_cause_is_retried_soon(tmp_path: Path) -> None:
    loop = LoopClock(park_after=2)
    node = Node(tmp_path, loop=loop)
    node.manifests.fail(A, RegistryUnavailable("connection refused"), None)
    node.write_set("apps", A)
    await node.run_until_parked()
    assert loop.waits == [5.0, 600.0]
    assert node.pinned() == {A}


async def test_a_size_unknown_for_a_permanent_cause_waits_for_the_resync(tmp_path: Path) -> None:
    loop = LoopClock(park_after=1)
    node = Node(tmp_path, loop=loop)
    node.manifests.fail(A, ImageNotFound("HTTP 404"))
    node.write_set("apps", A)
    await node.run_until_parked()
    assert loop.waits == [600.0]


# ---------------------------------------------------------------- the runtime down
async def test_while_pulls_wait_for_the_runtime_the_status_says_it_is_down(tmp_path: Path) -> None:
    node = Node(tmp_path, attempts=1)
    node.write_set("apps", A, B)
    await node.sync()  # a first status exists
    node.write_set("apps", A, B, generation=5)
    for image in (A, B):
        await node.crio.remove_image(image)
    during: list[dict[str, Any]] = []
    outage = [RuntimeUnreachable("crio.sock: connection refused")] * 3

    async def pull(image: str) -> None:
        if image == A and outage:
            if len(outage) == 1:
                during.append(node.status_file())
            raise outage.pop()

    node.crio.pull_handler = pull
    with capture_logs() as logs:
        status = await node.sync()

    degraded = next(c for c in during[0]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RuntimeUnreachable")
    assert "crio.sock: connection refused" in degraded["message"]
    ready = next(c for c in during[0]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RuntimeUnreachable")
    events = [e["event"] for e in logs if e["event"] in ("pulls_waiting", "pulls_resumed")]
    assert events == ["pulls_waiting", "pulls_resumed"]
    assert by_name(status)["apps"].state == "Pinned"
    assert condition(status, "Ready") == (True, "AllPinned")


class VersionFails(FakeCrio):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def version(self) -> RuntimeVersion:
        raise self.error


async def test_a_sync_that_cannot_run_names_its_own_cause(tmp_path: Path) -> None:
    for error, reason in (
        (RuntimeUnreachable("crio.sock: connection refused"), "RuntimeUnreachable"),
        (RuntimeDoesNotPin("cri-o 1.27.0 does not support pinned_images"), "RuntimeDoesNotPin"),
    ):
        loop = LoopClock(park_after=1)
        node = Node(tmp_path / reason, loop=loop, crio=VersionFails(error))
        node.write_set("apps", A)
        await node.run_until_parked()
        degraded = next(c for c in node.status_file()["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", reason)
