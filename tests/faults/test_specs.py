"""Drills: a burst of spec edits; a spec file broken, emptied or half-written under a set.

The burst is 80 edits in about eight seconds, drawn from a seeded random sequence: atomic
saves (temp file and rename, as editors and config management do), in-place saves
(truncate then write: a reader may see the file empty or half-written for a moment),
deletions and re-creations. The proxy slows the pulls to 8 MiB/s, and some pauses between
edits are longer than the daemon's 0.2 s debounce, so edits land while syncs pull. The
node must end exactly at the last state written.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import NodeFactory
from tests.faults.consistency import (
    assert_node_consistent,
    hold_status_names,
    stored_images,
    wait_settled,
    wait_status_names,
)
from tests.faults.node import DrillNode
from tests.testenv.agent import pinned_image_set_yaml, set_state, set_status

pytestmark = pytest.mark.drill

SETS = ("alpha", "beta", "gamma", "delta")


def save_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.edit")
    tmp.write_text(text)
    tmp.replace(path)


def save_in_place(path: Path, text: str) -> None:
    with path.open("w") as out:  # truncates first: the file is empty, then partly written
        half = len(text) // 2
        out.write(text[:half])
        out.flush()
        out.write(text[half:])


def burst(node: DrillNode, refs: list[str], *, edits: int, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311  a burst to replay, not a secret
    directory = node.agent.persistent_dir
    for _ in range(edits):
        name = rng.choice(SETS)
        path = directory / f"{name}.yaml"
        action = rng.choice(("atomic", "atomic", "in-place", "delete"))
        if action == "delete":
            path.unlink(missing_ok=True)
        else:
            chosen = rng.sample(refs, rng.randint(1, 3))
            save = save_atomically if action == "atomic" else save_in_place
            save(path, pinned_image_set_yaml(name, chosen))
        time.sleep(rng.uniform(0.0, 0.2))


@pytest.mark.timeout(180)
async def test_burst_of_spec_edits_ends_exactly_at_the_last_state(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node()
    refs = [node.ref(r) for r in drill_images]
    node.agent.start()
    node.agent.wait_log("sync_finished")
    mark = node.mark()

    node.proxy.throttle(8 << 20)
    burst(node, refs, edits=80, seed=13)
    node.proxy.throttle(None)
    final = {"alpha": refs[0:2], "beta": refs[2:3], "delta": refs[1:5]}
    for name, chosen in final.items():
        save_atomically(
            node.agent.persistent_dir / f"{name}.yaml", pinned_image_set_yaml(name, chosen)
        )
    (node.agent.persistent_dir / "gamma.yaml").unlink(missing_ok=True)

    node.agent.wait_status(
        lambda s: (
            {item["name"] for item in s.get("pinnedImageSets", [])} == set(final)
            and all(set_state(s, name) == "Pinned" for name in final)
            and all(_pins(s, name) == len(final[name]) for name in final)
        ),
        what="exactly the final sets pinned",
    )
    await assert_node_consistent(node, sets=final, since=mark)
    assert node.agent.process is not None and node.agent.process.poll() is None
    assert edits_during_pulls(node.agent_log_since(mark)) >= 1, "no edit landed mid-pull"


def edits_during_pulls(log: str) -> int:
    """How many changes the daemon noticed while a sync's pulls were running."""
    pulling, seen = False, 0
    for line in log.splitlines():
        if line.startswith("pulls_started"):
            pulling = True
        elif line.startswith("sync_finished"):
            pulling = False
        elif line.startswith("files_changed") and pulling:
            seen += 1
    return seen


def _pins(status: dict[str, Any], name: str) -> int:
    item = set_status(status, name)
    return int(item["images"]["pinned"]) if item else -1


def break_spec(path: Path, good: str) -> None:
    """Replaced (atomically) by a document that is no PinnedImageSet."""
    save_atomically(path, good.replace("  pinnedImages:\n", "  pinnedImages: 42\n  x:\n"))


def empty_for_half_a_second(path: Path, good: str) -> None:
    """An in-place save that left the file empty for half a second, then wrote it whole."""
    with path.open("w") as out:
        out.flush()
        os.fsync(out.fileno())
        time.sleep(0.5)
        out.write(good)


def half_write(path: Path, good: str) -> None:
    """A save cut off in the middle of the last digest (a crash, a full disk)."""
    save_in_place(path, good[: good.rindex("@sha256:") + 20])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("damage", "is_broken"),
    [
        pytest.param(break_spec, True, id="invalid"),
        pytest.param(empty_for_half_a_second, False, id="empty", marks=pytest.mark.drill_long),
        pytest.param(half_write, True, id="half-written", marks=pytest.mark.drill_long),
    ],
)
async def test_a_broken_spec_file_keeps_its_set_pinned_at_the_last_good_generation(
    make_node: NodeFactory,
    drill_images: list[str],
    damage: Callable[[Path, str], None],
    is_broken: bool,
) -> None:
    node = make_node()
    refs = [node.ref(r) for r in drill_images]
    keep, other = refs[:3], refs[3:4]
    spec = node.agent.write_set("keep", keep)
    node.agent.write_set("other", other)
    node.agent.start()
    node.agent.wait_status(
        lambda s: set_state(s, "keep") == set_state(s, "other") == "Pinned", what="both pinned"
    )
    good = spec.read_text()
    generation = (set_status(node.agent.status() or {}, "keep") or {})["currentGeneration"]
    mark = node.mark()
    changes = node.agent.current_run_log().count("files_changed")
    struck_at = time.monotonic()

    damage(spec, good)
    if is_broken:
        wait_status_names(node, "SpecInvalid", timeout_s=10)
        hold_status_names(node, "SpecInvalid", for_s=3)
        assert "WARNING" in node.agent_log_since(mark)
        save_atomically(spec, good)  # repaired
    wait_settled(node, changes_before=changes)
    status = node.agent.status() or {}
    assert not any(p["file"] == str(spec) for p in status.get("specProblems", [])), status

    lost = node.watch.times_without(set(keep), since_s=struck_at)
    assert lost == [], f"keep's images left the pin drop-in {len(lost)} time(s)"
    flags = {name: i.is_pinned for i in await stored_images(node) for name in i.names()}
    assert all(flags.get(ref) for ref in keep), flags
    item = set_status(node.agent.status() or {}, "keep")
    assert item is not None
    assert item["currentGeneration"] == generation
    await assert_node_consistent(node, sets={"keep": keep, "other": other}, since=mark)
