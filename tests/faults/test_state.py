"""Drills: the state nodeagent keeps is damaged (the ledger, the status file, a cache entry).

What the issue asks of each: the damaged file is moved aside (kept for the report), named
in a warning with its own reason code (``StateFileDamaged``), and rebuilt from the spec
files and the runtime; pinning goes on, ``render-pins --write`` (the unit's ExecStartPre)
still renders the persistent pins, and generations are not reset by the rebuild.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_node_consistent, reasons_in
from tests.faults.node import DrillNode, Mark, pins_of
from tests.testenv.agent import set_state, set_status

pytestmark = pytest.mark.drill

DAMAGED = "reason=StateFileDamaged"


def warned_damaged(node: DrillNode, mark: Mark) -> bool:
    return any(
        line.startswith("WARNING ") and DAMAGED in line
        for line in node.agent_log_since(mark).splitlines()
    )


def kept_aside(state_dir: Path, stem: str, damaged: bytes | None) -> list[Path]:
    """Entries of the state dir, other than the live file, that keep the damaged one."""
    live = f"{stem}.json"
    found = []
    for path in state_dir.rglob(f"*{stem}*"):
        if path.name == live:
            continue
        if damaged is None:
            found.append(path)  # a directory was damaged: whatever took its place aside
        elif path.is_file() and path.read_bytes() == damaged:
            found.append(path)
    return found


def pinned_at_generation_2(node: DrillNode, keep: list[str]) -> None:
    node.agent.write_set("keep", keep[:1])
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "keep") == "Pinned", what="keep pinned")
    node.agent.write_set("keep", keep)
    node.agent.wait_status(
        lambda s: (set_status(s, "keep") or {}).get("currentGeneration") == 2,
        what="keep pinned at generation 2",
    )


def not_blaming_the_runtime(status: dict[str, Any]) -> bool:
    """CRI-O runs all along: a status that blames it names the wrong cause (fail at once)."""
    assert "RuntimeUnreachable" not in reasons_in(status), f"the status blames CRI-O: {status}"
    return True


LedgerDamage = Callable[[Path], bytes | None]


def _write(data: bytes) -> LedgerDamage:
    def damage(path: Path) -> bytes:
        path.write_bytes(data)
        return data

    return damage


def _directory(path: Path) -> None:
    path.unlink()
    (path / "x").mkdir(parents=True)


def _wrong_entry(value: object) -> LedgerDamage:
    """keep's ``pinnedImages`` replaced by ``value`` (5 raised TypeError out of the sync; a
    string was read as one image per character and rendered as pins)."""

    def damage(path: Path) -> bytes:
        doc = json.loads(path.read_text())
        doc["sets"]["keep"]["pinnedImages"] = value
        data = json.dumps(doc).encode()
        path.write_bytes(data)
        return data

    return damage


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_write(b""), id="empty"),
        pytest.param(_write(b"\xff\xfe{\x00"), id="not-utf8", marks=pytest.mark.drill_long),
        pytest.param(_write(b"[]\n"), id="a-list", marks=pytest.mark.drill_long),
        pytest.param(_directory, id="a-directory", marks=pytest.mark.drill_long),
        pytest.param(_wrong_entry(5), id="entry-a-number", marks=pytest.mark.drill_long),
        pytest.param(_wrong_entry("quay.io/x"), id="entry-a-string", marks=pytest.mark.drill_long),
    ],
)
async def test_damaged_ledger_is_moved_aside_and_rebuilt_and_pinning_goes_on(
    make_node: NodeFactory, drill_images: list[str], damage: LedgerDamage
) -> None:
    node = make_node()
    refs = [node.ref(r) for r in drill_images]
    keep, fresh = refs[:2], refs[2:3]
    pinned_at_generation_2(node, keep)
    mark = node.mark()

    damaged = damage(node.agent.state_dir / "ledger.json")
    node.agent.write_set("fresh", fresh)  # a sync must read the ledger now
    node.agent.wait_status(
        lambda s: (
            not_blaming_the_runtime(s) and set_state(s, "fresh") == set_state(s, "keep") == "Pinned"
        ),
        what="fresh pinned, keep still pinned",
        timeout_s=30,
    )
    assert warned_damaged(node, mark), "no warning with reason StateFileDamaged"
    assert kept_aside(node.agent.state_dir, "ledger", damaged), "the damaged ledger was not kept"
    item = set_status(node.agent.status() or {}, "keep")
    assert item is not None
    assert item["desiredGeneration"] == item["currentGeneration"] == 2  # not reset to 1
    rendered = node.agent.cli("render-pins", "--write")
    assert rendered.returncode == 0, rendered.stderr
    assert set(keep + fresh) <= set(pins_of(node.target.read_text()))
    await assert_node_consistent(node, sets={"keep": keep, "fresh": fresh}, since=mark)


@pytest.mark.drill_long
@pytest.mark.timeout(120)
@pytest.mark.parametrize("is_directory", [False, True], ids=["garbage", "a-directory"])
async def test_damaged_status_file_is_moved_aside_and_rebuilt(
    make_node: NodeFactory, drill_images: list[str], is_directory: bool
) -> None:
    node = make_node()
    keep = [node.ref(r) for r in drill_images[:2]]
    pinned_at_generation_2(node, keep)
    node.agent.kill()
    mark = node.mark()
    status_file = node.agent.state_dir / "status.json"
    damaged: bytes | None = None
    if is_directory:
        status_file.unlink()
        (status_file / "x").mkdir(parents=True)
    else:
        damaged = b'{"pinnedImageSets": [{"name": '
        status_file.write_bytes(damaged)

    node.agent.start()
    node.agent.wait_status(
        lambda s: set_state(s, "keep") == "Pinned", what="status rebuilt", timeout_s=30
    )
    assert warned_damaged(node, mark), "no warning with reason StateFileDamaged"
    assert kept_aside(node.agent.state_dir, "status", damaged), "the damaged status was not kept"
    assert (node.agent.cli("status").returncode, status_file.is_file()) == (0, True)
    await assert_node_consistent(node, sets={"keep": keep}, since=mark)


@pytest.mark.drill_long
@pytest.mark.timeout(120)
async def test_damaged_manifest_cache_entry_is_moved_aside_and_rebuilt(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node()
    keep = [node.ref(r) for r in drill_images[:2]]
    pinned_at_generation_2(node, keep)
    node.agent.kill()
    mark = node.mark()
    entry = sorted((node.agent.state_dir / "manifests").glob("*.json"))[0]
    damaged = entry.read_bytes()[:-7]
    entry.write_bytes(damaged)

    node.agent.start()
    # Sizing a new image reads the stored images' manifests too (their layers are not
    # counted again), so the next admission reads every entry.
    fresh = [node.ref(drill_images[2])]
    node.agent.write_set("fresh", fresh)
    node.agent.wait_status(lambda s: set_state(s, "fresh") == "Pinned", what="fresh pinned")
    assert warned_damaged(node, mark), "no warning with reason StateFileDamaged"
    assert kept_aside(node.agent.state_dir, entry.stem, damaged), "the damaged entry was not kept"
    assert json.loads(entry.read_bytes())  # rebuilt from the registry
    await assert_node_consistent(node, sets={"keep": keep, "fresh": fresh}, since=mark)
