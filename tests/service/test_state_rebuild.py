"""Damaged state is rebuilt, never fatal (issue 13, "State that can be rebuilt is rebuilt").

A damaged ledger (empty, not UTF-8, a list, a directory, an entry of the wrong type) is
set aside beside itself, named in a ``state_file_damaged`` warning and the status's
``stateRepairs`` with reason ``StateFileDamaged``, and rebuilt: its last good copy, the
published status's generations, what the runtime reports pinned, the spec files. No
pin is lost and no generation goes back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.errors import ImageNotFound
from nodeagent.ledger import LedgerStore
from tests.service.pin_node import A, B, C, D, Node, by_name, condition


def damage(path: Path, how: str) -> None:
    content: dict[str, bytes] = {
        "empty": b"",
        "not-utf8": b"\xff\xfe{\x00}",
        "list": b"[]",
        "wrong-entry": b'{"bootId": "boot-1", "sets": {"apps": {"pinnedImages": 5}}}',
        "string-images": b'{"bootId": "boot-1", "sets": {"apps": {"pinnedImages": "quay.io/x"}}}',
        "truncated": b'{"bootId": "boot-1", "sets": {"apps": {"desiredGen',
    }
    path.unlink()
    if how == "directory":
        path.mkdir()
        (path / "x").write_text("x")
    else:
        path.write_bytes(content[how])


async def pinned_node(tmp_path: Path) -> Node:
    """Two persistent sets pinned: apps at its spec's generation 3, web changed once (2)."""
    node = Node(tmp_path)
    node.write_set("apps", A, generation=3)
    node.write_set("web", B)
    await node.sync()
    node.write_set("web", B, C)
    status = await node.sync()
    assert {s.name: (s.state, s.current_generation) for s in status.sets} == {
        "apps": ("Pinned", 3),
        "web": ("Pinned", 2),
    }
    return node


def restarted(node: Node, **kw: Any) -> Node:
    return Node(node.base, crio=node.crio, dropins=node.dropins, manifests=node.manifests, **kw)


@pytest.mark.parametrize(
    "how",
    ["empty", "not-utf8", "list", "directory", "wrong-entry", "string-images", "truncated"],
)
async def test_a_damaged_ledger_is_set_aside_and_rebuilt_keeping_pins_and_generations(
    tmp_path: Path, how: str
) -> None:
    node = await pinned_node(tmp_path)
    damage(node.state_dir / "ledger.json", how)

    again = restarted(node)
    with capture_logs() as logs:
        await again.reconciler.boot()
        assert again.pinned() == {A, B, C}  # boot pins: nothing was unpinned
        status = await again.sync()

    sets = by_name(status)
    assert {n: (s.state, s.desired_generation, s.current_generation) for n, s in sets.items()} == {
        "apps": ("Pinned", 3, 3),
        "web": ("Pinned", 2, 2),
    }
    assert again.pinned() == {A, B, C}
    assert condition(status, "Ready") == (True, "AllPinned")
    copies = again.damaged_copies("ledger")
    assert len(copies) == 1
    assert copies[0].is_dir() == (how == "directory")
    repairs = again.status_file()["stateRepairs"]
    assert [(r["file"], r["reason"], r["movedTo"]) for r in repairs] == [
        ("ledger", "StateFileDamaged", str(copies[0]))
    ]
    warnings = [e for e in logs if e["event"] == "state_file_damaged"]
    assert [(w["file"], w["reason"], w["log_level"]) for w in warnings] == [
        ("ledger", "StateFileDamaged", "warning")
    ]
    # The rebuilt ledger is whole again, with its last good copy written after it.
    assert again.state("ledger")["sets"]["web"]["desiredGeneration"] == 2
    assert again.state("ledger.last-good") == again.state("ledger")


async def test_with_both_ledger_copies_damaged_the_published_status_keeps_generations(
    tmp_path: Path,
) -> None:
    node = await pinned_node(tmp_path)
    damage(node.state_dir / "ledger.json", "list")
    damage(node.state_dir / "ledger.last-good.json", "empty")

    again = restarted(node)
    await again.reconciler.boot()
    status = await again.sync()
    assert {n: s.current_generation for n, s in by_name(status).items()} == {"apps": 3, "web": 2}
    assert [r["file"] for r in again.status_file()["stateRepairs"]] == [
        "ledger",
        "ledger.last-good",
    ]
    assert len(again.damaged_copies("ledger.last-good")) == 1

    again.write_set("web", C)  # the next change counts on from the seeded generation
    status = await again.sync()
    assert by_name(status)["web"].desired_generation == 3
    assert again.pinned() == {A, C}


async def test_a_rebuild_adopts_what_the_runtime_pins_for_a_set_still_incomplete(
    tmp_path: Path,
) -> None:
    node = await pinned_node(tmp_path)
    node.write_set("apps", A, D, generation=4)
    node.failing[D] = [ImageNotFound("gone")] * 10
    status = await node.sync()
    assert by_name(status)["apps"].state == "Degraded"
    assert node.pinned() == {A, B, C}  # A stays pinned by generation 3
    damage(node.state_dir / "ledger.json", "empty")
    damage(node.state_dir / "ledger.last-good.json", "empty")

    again = restarted(node)
    again.failing[D] = [ImageNotFound("gone")] * 10
    status = await again.sync()
    apps = by_name(status)["apps"]
    assert (apps.state, apps.desired_generation, apps.current_generation) == ("Degraded", 4, 3)
    assert again.pinned() == {A, B, C}  # A adopted from the runtime: still pinned
    assert again.state("ledger")["sets"]["apps"]["pinnedImages"] == [A]


async def test_a_directory_in_place_of_the_status_file_is_set_aside_and_the_status_written(
    tmp_path: Path,
) -> None:
    node = await pinned_node(tmp_path)
    damage(node.state_dir / "status.json", "directory")

    again = restarted(node)
    await again.sync()
    assert again.status_file()["stateRepairs"][0]["file"] == "status"
    assert len(again.damaged_copies("status")) == 1
    assert (again.state_dir / "status.json").is_file()


async def test_a_node_that_never_synced_starts_quietly(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write_set("apps", A)
    with capture_logs() as logs:
        await node.reconciler.boot()
        status = await node.sync()
    assert by_name(status)["apps"].state == "Pinned"
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert "stateRepairs" not in node.status_file()


# ---------------------------------------------------------------- boot, read-only
async def test_render_pins_reads_around_a_damaged_ledger_without_moving_it(
    tmp_path: Path,
) -> None:
    """What ``render-pins --write`` renders before CRI-O starts: the ledger's last good
    copy plus the boot pins, even with a spec file broken; nothing is moved (the daemon
    sets the file aside and says so)."""
    node = await pinned_node(tmp_path)
    node.write_set("web", B, C, file="web.yaml").write_text("spec: [")  # broken too
    damage(node.state_dir / "ledger.json", "not-utf8")
    store = LedgerStore(node.store, "boot-2")  # after a reboot

    loaded = store.load(is_repairing=False)
    assert loaded.remembered_pins() == {A, B, C}
    assert [(r.file, r.moved_to) for r in loaded.repairs] == [("ledger", None)]
    assert node.damaged_copies("ledger") == []

    damage(node.state_dir / "ledger.last-good.json", "directory")
    assert store.load(is_repairing=False).remembered_pins() == {A, B, C}  # boot-pins.json


async def test_the_boot_pins_copy_holds_persistent_pins_only(tmp_path: Path) -> None:
    node = await pinned_node(tmp_path)
    assert node.state("boot-pins") == {"bootId": "boot-1", "images": sorted([A, B, C])}
