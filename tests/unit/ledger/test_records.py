"""Unit tests of the ledger: boots, generations, pinned and failed records, forgetting sets."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nodeagent.errors import StateFileDamaged
from nodeagent.ledger import Ledger, SetRecord, status_seeds

A, B, C = (f"r.io/ns/{n}@sha256:{i:064x}" for i, n in enumerate("abc", start=1))


def stored(boot_id: str = "boot-1") -> dict[str, Any]:
    return {
        "bootId": boot_id,
        "sets": {
            "persistent": {"desiredGeneration": 2, "persistent": True, "pinnedImages": [A]},
            "transient": {"desiredGeneration": 1, "persistent": False, "pinnedImages": [B]},
            "legacy": {"desiredGeneration": 1, "pinnedImages": [C]},  # no flag: transient
        },
    }


# ---------------------------------------------------------------- for_boot
def test_same_boot_keeps_every_set() -> None:
    got = Ledger.for_boot(stored(), "boot-1")
    assert list(got.sets) == ["persistent", "transient", "legacy"]
    assert got.pinned_images() == {A, B, C}
    assert got.sets["persistent"] == SetRecord(2, is_persistent=True, pinned_images=(A,))
    assert got.sets["legacy"].is_persistent is False


def test_the_document_round_trips() -> None:
    got = Ledger.for_boot(stored(), "boot-1")
    again = Ledger.for_boot(got.to_json(), "boot-1")
    assert again == got
    assert again.to_json() == got.to_json()
    assert got.to_json()["sets"]["persistent"] == stored()["sets"]["persistent"]


def test_new_boot_drops_transient_sets_and_keeps_persistent_ones() -> None:
    got = Ledger.for_boot(stored(), "boot-2")
    assert got.boot_id == "boot-2"
    assert list(got.sets) == ["persistent"]
    assert got.pinned_images() == {A}


def test_for_boot_never_changes_what_it_was_given() -> None:
    doc = stored()
    before = copy.deepcopy(doc)
    got = Ledger.for_boot(doc, "boot-2")
    got.record_pinned("persistent", 3, [A, B])
    got.observe_spec("new", "f", None, is_persistent=True)
    assert doc == before


def test_a_ledger_never_saved_starts_empty() -> None:
    got = Ledger.for_boot(None, "boot-9")
    assert got == Ledger("boot-9")
    assert got.to_json() == {"bootId": "boot-9", "sets": {}}


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"bootId": "boot-1"},
        {"bootId": "boot-1", "sets": []},
        {"sets": None},
        {"bootId": 7, "sets": {}},
    ],
)
def test_a_ledger_of_the_wrong_shape_is_damaged_not_empty(doc: dict[str, Any]) -> None:
    with pytest.raises(StateFileDamaged, match="no 'sets' object"):
        Ledger.for_boot(doc, "boot-9")


def test_ledger_without_boot_id_counts_as_another_boot() -> None:
    doc = stored()
    del doc["bootId"]
    assert list(Ledger.for_boot(doc, "boot-1").sets) == ["persistent"]


# ---------------------------------------------------------------- observe_spec
Step = tuple[str, int | None, int]
"""(fingerprint, spec generation, expected desired generation)."""


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [("f1", None, 1), ("f1", None, 1), ("f2", None, 2), ("f2", None, 2)], id="bump"
        ),
        pytest.param([("f1", None, 1), ("f2", None, 2), ("f1", None, 3)], id="back-to-old-list"),
        pytest.param([("f1", 5, 5), ("f1", 5, 5), ("f2", 6, 6)], id="spec-generation"),
        pytest.param([("f1", 5, 5), ("f1", 3, 5)], id="spec-generation-never-lowers"),
        pytest.param([("f1", 5, 5), ("f1", 7, 7)], id="spec-generation-rises-alone"),
        pytest.param([("f1", 5, 5), ("f1", None, 5), ("f2", None, 6)], id="spec-then-none"),
        pytest.param(
            [("f1", None, 1), ("f2", None, 2), ("f3", 1, 2)],
            id="stale-spec-generation-is-kept-although-the-list-changed",
        ),
        pytest.param([("f1", 0, 0), ("f1", None, 1)], id="zero-then-none"),
    ],
)
def test_observe_spec_generations(steps: list[Step]) -> None:
    doc = Ledger("boot-1")
    seen: list[int] = []
    for fingerprint, spec_generation, expected in steps:
        got = doc.observe_spec("set", fingerprint, spec_generation, is_persistent=True)
        assert got == expected, (fingerprint, spec_generation)
        assert doc.sets["set"].desired_generation == got
        assert doc.sets["set"].fingerprint == fingerprint
        seen.append(got)
    assert seen == sorted(seen)  # never decreases


def test_observe_spec_records_persistence() -> None:
    doc = Ledger("boot-1")
    doc.observe_spec("s", "f", None, is_persistent=False)
    assert doc.to_json()["sets"]["s"]["persistent"] is False
    doc.observe_spec("s", "f", None, is_persistent=True)
    assert doc.to_json()["sets"]["s"]["persistent"] is True


# ---------------------------------------------------------------- pinned / failed
def test_record_pinned_sets_current_generation_and_clears_the_failure() -> None:
    doc = Ledger("boot-1")
    doc.record_failed("s", 1, "ImageNotFound: gone")
    doc.record_pinned("s", 2, [B, A, A])
    item = doc.to_json()["sets"]["s"]
    assert item["currentGeneration"] == 2
    assert item["pinnedImages"] == [A, B]
    assert "lastFailedGeneration" not in item
    assert "lastFailedError" not in item


def test_current_generation_never_decreases() -> None:
    doc = Ledger("boot-1")
    doc.record_pinned("s", 3, [A])
    doc.record_pinned("s", 2, [B])
    assert doc.sets["s"].current_generation == 3
    assert doc.sets["s"].pinned_images == (B,)


def test_record_failed_keeps_current_and_the_highest_failed_generation() -> None:
    doc = Ledger("boot-1")
    doc.record_pinned("s", 1, [A])
    doc.record_failed("s", 3, "first")
    doc.record_failed("s", 2, "second")
    item = doc.to_json()["sets"]["s"]
    assert (item["currentGeneration"], item["pinnedImages"]) == (1, [A])
    assert (item["lastFailedGeneration"], item["lastFailedError"]) == (3, "second")


# ---------------------------------------------------------------- forget / queries
def test_forget_drops_sets_and_returns_the_images_they_had_pinned() -> None:
    doc = Ledger.for_boot(stored(), "boot-1")
    released = doc.forget(["transient", "legacy", "never-existed"])
    assert sorted(released) == [B, C]
    assert list(doc.sets) == ["persistent"]


def test_forget_of_a_set_that_never_pinned_releases_nothing() -> None:
    doc = Ledger("boot-1")
    doc.observe_spec("new", "f", None, is_persistent=True)
    assert doc.forget(["new"]) == []
    assert doc.sets == {}


def test_forget_accepts_a_live_view_of_the_sets() -> None:
    doc = Ledger.for_boot(stored(), "boot-1")
    assert sorted(doc.forget(doc.sets.keys())) == [A, B, C]


@pytest.mark.parametrize(("is_persistent_only", "expected"), [(False, {A, B, C}), (True, {A})])
def test_pinned_images(is_persistent_only: bool, expected: set[str]) -> None:
    doc = Ledger.for_boot(stored(), "boot-1")
    assert doc.pinned_images(is_persistent_only=is_persistent_only) == expected


def test_pinned_of_one_set() -> None:
    doc = Ledger.for_boot(stored(), "boot-1")
    assert doc.pinned_of("transient") == {B}
    assert doc.pinned_of("unknown") == set()


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ({"desiredGeneration": "2"}, "desiredGeneration must be an integer"),
        ({"desiredGeneration": True}, "desiredGeneration must be an integer"),
        ({"desiredGeneration": -1}, "desiredGeneration must be an integer from 0"),
        ({"desiredGeneration": 2**63}, "desiredGeneration must be an integer from 0"),
        ({"currentGeneration": 1.5}, "currentGeneration must be an integer"),
        ({"pinnedImages": "r.io/a"}, "pinnedImages must be a list, got str"),
        ({"pinnedImages": 5}, "pinnedImages must be a list, got int"),
        ({"pinnedImages": [1, None, A]}, "pinnedImages must be a list of strings"),
        ({"lastFailedError": 7}, "lastFailedError must be a str"),
        ({"persistent": "yes"}, "persistent must be a bool"),
        ({"source": ["a"]}, "source must be a str"),
        ([1], "is a list, not an object"),
        ("x", "is a str, not an object"),
    ],
)
def test_an_entry_of_the_wrong_type_is_damage_named_by_entry_and_field(
    item: Any, match: str
) -> None:
    """Never half-read: an image list read as its characters would unpin every image."""
    with pytest.raises(StateFileDamaged, match=f"ledger entry 's'.*{match}"):
        Ledger.for_boot({"bootId": "b", "sets": {"ok": {"desiredGeneration": 1}, "s": item}}, "b")


# ---------------------------------------------------------------- sources, held sets, seeds
def test_observe_spec_records_the_file_and_the_round_trip_keeps_it() -> None:
    doc = Ledger("b")
    doc.observe_spec("s", "f", None, is_persistent=True, source="/etc/x/a.yaml")
    again = Ledger.for_boot(doc.to_json(), "b")
    assert again.sets["s"].source == "/etc/x/a.yaml"
    doc.observe_spec("s", "f", None, is_persistent=True)  # no source given: the known one stays
    assert doc.sets["s"].source == "/etc/x/a.yaml"


def held_ledger() -> Ledger:
    doc = Ledger("b")
    for name, source in (("a", "/d/one.yaml"), ("b", "/d/one.yaml"), ("c", "/d/two.yaml")):
        doc.observe_spec(name, "f", None, is_persistent=True, source=source)
    doc.observe_spec("old", "f", None, is_persistent=True)  # an older ledger: no file known
    return doc


@pytest.mark.parametrize(
    ("loaded", "problems", "held"),
    [
        pytest.param(set(), [], {}, id="no-problem-nothing-held"),
        pytest.param(set(), ["/d/one.yaml"], {"a": "/d/one.yaml", "b": "/d/one.yaml"}, id="file"),
        pytest.param({"a"}, ["/d/one.yaml"], {"b": "/d/one.yaml"}, id="one-set-still-loads"),
        pytest.param(
            set(),
            ["/d"],
            {"a": "/d/one.yaml", "b": "/d/one.yaml", "c": "/d/two.yaml"},
            id="unlistable-directory",
        ),
        pytest.param(set(), ["/d/one.yaml.bak", "/dd"], {}, id="prefix-is-not-a-parent"),
    ],
)
def test_held_sets_are_those_whose_file_has_a_problem_and_that_did_not_load(
    loaded: set[str], problems: list[str], held: dict[str, str]
) -> None:
    assert held_ledger().held(loaded, problems) == held


def test_seed_raises_generations_and_fills_only_what_is_unknown() -> None:
    doc = Ledger("b")
    doc.record_pinned("s", 3, [A])
    doc.entry("s").desired_generation = 4
    doc.seed("s", SetRecord(2, 2, source="/d/s.yaml", pinned_images=(B,)))
    record = doc.sets["s"]
    assert (record.desired_generation, record.current_generation) == (4, 3)
    assert (record.source, record.pinned_images) == ("/d/s.yaml", (A,))
    doc.seed("s", SetRecord(9, 8, last_failed_generation=9, last_failed_error="x"))
    assert (record.desired_generation, record.current_generation) == (9, 8)
    assert (record.last_failed_generation, record.last_failed_error) == (9, "x")


def test_a_seeded_generation_without_fingerprint_is_kept_then_counts_from_there() -> None:
    doc = Ledger("b")
    doc.seed("s", SetRecord(7, 7))
    assert doc.observe_spec("s", "f1", None, is_persistent=True) == 7
    assert doc.observe_spec("s", "f1", None, is_persistent=True) == 7
    assert doc.observe_spec("s", "f2", None, is_persistent=True) == 8


def test_status_seeds_read_generations_files_and_boots_tolerantly() -> None:
    status = {
        "bootId": "boot-1",
        "pinnedImageSets": [
            {
                "name": "p",
                "desiredGeneration": 4,
                "currentGeneration": 3,
                "persistent": True,
                "source": "/d/p.yaml",
            },
            {"name": "t", "desiredGeneration": 2, "persistent": False},
            {"name": "bad", "desiredGeneration": "x"},
            "not an object",
            {"desiredGeneration": 1},
        ],
    }
    this_boot = status_seeds(status, "boot-1")
    assert sorted(this_boot) == ["p", "t"]
    assert this_boot["p"] == SetRecord(4, 3, is_persistent=True, source="/d/p.yaml")
    assert sorted(status_seeds(status, "boot-2")) == ["p"]  # transient sets die with the boot
    assert status_seeds(None, "b") == {}
    assert status_seeds({"pinnedImageSets": 3}, "b") == {}
