"""The last good set stands (issue 13): an invalid, empty or half-written spec file keeps
the sets it held at their last good generation, pinned, with a ``set_held`` warning and
``SpecInvalid`` in the status; only removing the file unpins them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.service.pin_node import A, B, C, D, Node, by_name, condition, set_yaml

GOOD = set_yaml("apps", A, B, generation=2)

BROKEN = {
    "not-yaml": "spec: [",
    "empty": "",
    "comment-only": "# saving...\n",
    "half-written": GOOD[: len(GOOD) // 2],
    "invalid-set": set_yaml("apps", A, B).replace(f"    - name: {B}\n", "    - name: x:latest\n"),
    "no-images": set_yaml("apps").replace("  pinnedImages:\n", "  pinnedImages: []\n"),
    "not-utf8": "\udcff",
}


def write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


async def pinned(tmp_path: Path) -> Node:
    node = Node(tmp_path)
    write(node.spec_file("apps.yaml"), GOOD)
    node.write_set("other", C)
    status = await node.sync()
    assert by_name(status)["apps"].state == "Pinned"
    assert node.pinned() == {A, B, C}
    return node


@pytest.mark.parametrize("how", sorted(BROKEN))
async def test_a_broken_file_keeps_its_set_pinned_at_its_last_good_generation(
    tmp_path: Path, how: str
) -> None:
    node = await pinned(tmp_path)
    write(node.spec_file("apps.yaml"), BROKEN[how])

    with capture_logs() as logs:
        status = await node.sync()

    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason) == ("Pinned", "SpecInvalid")
    assert (apps.desired_generation, apps.current_generation) == (2, 2)
    assert (apps.images_total, apps.images_pinned) == (2, 2)
    assert apps.source == str(node.spec_file("apps.yaml"))
    assert "stays pinned until the file is fixed" in (apps.last_failed_error or "")
    assert node.pinned() == {A, B, C}
    assert condition(status, "Degraded") == (True, "SpecInvalid")
    assert by_name(status)["other"].state == "Pinned"
    held = [e for e in logs if e["event"] == "set_held"]
    assert [(e["set"], e["reason"], e["log_level"]) for e in held] == [
        ("apps", "SpecInvalid", "warning")
    ]
    doc = node.status_file()
    assert [p["file"] for p in doc["specProblems"]] == [str(node.spec_file("apps.yaml"))]

    write(node.spec_file("apps.yaml"), GOOD)  # fixed: back to normal
    status = await node.sync()
    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason, status.problems) == ("Pinned", None, ())
    assert condition(status, "Ready") == (True, "AllPinned")


async def test_only_removing_the_file_unpins_its_sets(tmp_path: Path) -> None:
    node = await pinned(tmp_path)
    write(node.spec_file("apps.yaml"), "")
    await node.sync()
    await node.sync()
    assert node.pinned() == {A, B, C}

    node.spec_file("apps.yaml").unlink()
    with capture_logs() as logs:
        status = await node.sync()
    assert sorted(by_name(status)) == ["other"]
    assert node.pinned() == {C}
    assert [e["set"] for e in logs if e["event"] == "set_removed"] == ["apps"]


async def test_a_file_that_loads_without_the_set_lets_it_go(tmp_path: Path) -> None:
    node = await pinned(tmp_path)
    write(node.spec_file("apps.yaml"), set_yaml("renamed", D))
    status = await node.sync()
    assert sorted(by_name(status)) == ["other", "renamed"]
    assert node.pinned() == {C, D}


async def test_in_a_file_of_two_sets_only_the_broken_one_is_held(tmp_path: Path) -> None:
    node = Node(tmp_path)
    path = node.spec_file("both.yaml")
    write(path, set_yaml("one", A) + "---\n" + set_yaml("two", B))
    await node.sync()
    write(path, set_yaml("one", A, C) + "---\n" + set_yaml("two", "bad:ref"))

    status = await node.sync()
    sets = by_name(status)
    assert (sets["one"].state, sets["one"].reason, sets["one"].current_generation) == (
        "Pinned",
        None,
        2,
    )
    assert (sets["two"].state, sets["two"].reason) == ("Pinned", "SpecInvalid")
    assert node.pinned() == {A, B, C}


async def test_a_held_set_stays_held_across_a_restart(tmp_path: Path) -> None:
    node = await pinned(tmp_path)
    write(node.spec_file("apps.yaml"), "spec: [")
    await node.sync()

    again = Node(node.base, crio=node.crio, dropins=node.dropins, manifests=node.manifests)
    await again.reconciler.boot()
    status = await again.sync()
    assert (by_name(status)["apps"].state, by_name(status)["apps"].reason) == (
        "Pinned",
        "SpecInvalid",
    )
    assert again.pinned() == {A, B, C}


async def test_a_set_broken_before_it_was_ever_pinned_is_held_without_pins(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, manifests=None)
    node.manifests.sizes.pop(D)  # D cannot be found: the set never completes
    write(node.spec_file("apps.yaml"), set_yaml("apps", A, D))
    status = await node.sync()
    assert by_name(status)["apps"].state == "Degraded"
    write(node.spec_file("apps.yaml"), "spec: [")

    status = await node.sync()
    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason, apps.current_generation) == ("Degraded", "SpecInvalid", None)
    assert node.pinned() == set()


async def test_broken_file_and_damaged_ledger_copies_keep_the_set_through_the_boot_pins(
    tmp_path: Path,
) -> None:
    """Both ledger copies damaged and the set's file broken: the published status says
    which file the set came from, the boot pins which images it pinned."""
    node = await pinned(tmp_path)
    write(node.spec_file("apps.yaml"), "spec: [")
    (node.state_dir / "ledger.json").write_text("[]")
    (node.state_dir / "ledger.last-good.json").write_text("")

    again = Node(node.base, crio=node.crio, dropins=node.dropins, manifests=node.manifests)
    await again.reconciler.boot()
    status = await again.sync()
    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason, apps.current_generation) == ("Pinned", "SpecInvalid", 2)
    assert again.pinned() == {A, B, C}
    assert again.state("ledger")["sets"]["apps"]["pinnedImages"] == [A, B]
