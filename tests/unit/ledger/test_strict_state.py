"""State files read back strictly: every crash or misreading input is damage, set aside and
rebuilt from the last good copy (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters import files
from nodeagent.adapters.files import JsonStateStore
from nodeagent.cli.main import main
from nodeagent.errors import StateFileDamaged
from nodeagent.ledger import Ledger, LedgerStore

A = "r.io/ns/a@sha256:" + "a" * 64


def good_ledger() -> Ledger:
    ledger = Ledger("boot-1")
    ledger.observe_spec("p", "f", 3, is_persistent=True, source="/d/p.yaml")
    ledger.record_pinned("p", 3, [A])
    return ledger


def entry(**fields: Any) -> bytes:
    record = {"desiredGeneration": 3, "currentGeneration": 3, "persistent": True}
    record |= {"pinnedImages": [A]} | fields
    return json.dumps({"bootId": "boot-1", "sets": {"p": record}}).encode()


DAMAGED_LEDGERS = [
    (b'{"bootId": "boot-1", "sets": {}, "sets": {"x": {}}}', "duplicate key 'sets'"),
    (b'{"bootId": "boot-1", "sets": {"p": {"desiredGeneration": NaN}}}', "NaN"),
    (b'{"sets": ' + b"[" * 40 + b"]" * 40 + b"}", "nested 41 deep"),
    (b'{"bootId": "q\\ud800", "sets": {}}', "lone surrogate"),
    (entry(desiredGeneration=2**63), "desiredGeneration must be an integer from 0 to 2^63-1"),
    (entry(currentGeneration=-1), "currentGeneration must be an integer from 0 to 2^63-1"),
    (entry(currentGeneration=1.5), "currentGeneration must be an integer"),
    (entry(lastFailedGeneration="7"), "lastFailedGeneration must be an integer"),
    (entry(currentGeneration=True), "currentGeneration must be an integer"),
    (entry(pinnedImages=A), "pinnedImages must be a list, got str"),
    (entry(pinnedImages=["x" * 2000]), "pinnedImages must be a list of strings"),
    (entry(pinnedImages=[""]), "pinnedImages must be a list of strings"),
    (entry(pinnedImages=[A] * 10_001), "pinnedImages must be a list of strings"),
    (entry(lastFailedError="e" * 100_000), "lastFailedError holds 100000 characters"),
    (entry(source=["/d"]), "source must be a str"),
    (json.dumps({"bootId": "b" * 200, "sets": {}}).encode(), "'bootId' not a string"),
    (json.dumps({"sets": {"n" * 300: {}}}).encode(), "a set name of 300 characters"),
]


@pytest.mark.parametrize(("data", "fragment"), DAMAGED_LEDGERS)
def test_a_damaged_ledger_is_set_aside_and_the_last_good_copy_used(
    tmp_path: Path, data: bytes, fragment: str
) -> None:
    store = JsonStateStore(tmp_path)
    LedgerStore(store, "boot-1").save(good_ledger())
    (tmp_path / "ledger.json").write_bytes(data)
    loaded = LedgerStore(store, "boot-1").load()
    assert loaded.origin == "last-good"
    assert [r.file for r in loaded.repairs] == ["ledger"]
    assert fragment in loaded.repairs[0].message
    assert len(loaded.repairs[0].message) < 600
    assert loaded.remembered_pins() == {A}
    assert len(list(tmp_path.glob("ledger.json.damaged-*"))) == 1


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"bootId": "boot-1", "images": A}, "must be a list of image names"),
        ({"bootId": "boot-1", "images": [1, 2]}, "holds 1, not an image name"),
        ({"bootId": "boot-1", "images": ["\x1b[2J" + "x" * 5000]}, "not an image name"),
        ({"bootId": "boot-1"}, "must be a list of image names"),
    ],
)
def test_damaged_boot_pins_are_set_aside_not_half_read(
    tmp_path: Path, doc: dict[str, Any], fragment: str
) -> None:
    store = JsonStateStore(tmp_path)
    store.save("boot-pins", doc)
    (tmp_path / "ledger.json").write_text("[]")
    loaded = LedgerStore(store, "boot-1").load()
    assert loaded.boot_pins == frozenset()
    repair = next(r for r in loaded.repairs if r.file == "boot-pins")
    assert fragment in repair.message
    assert "\x1b" not in repair.message
    assert len(repair.message) < 400
    assert len(list(tmp_path.glob("boot-pins.json.damaged-*"))) == 1


def test_a_status_of_impossible_generations_seeds_nothing_from_that_set(tmp_path: Path) -> None:
    store = JsonStateStore(tmp_path)
    item = {"name": "p", "desiredGeneration": 2**64, "persistent": True}
    long_name = {"name": "n" * 300, "desiredGeneration": 1, "persistent": True}
    good = {"name": "q", "desiredGeneration": 4, "currentGeneration": 4, "persistent": True}
    store.save("status", {"bootId": "boot-1", "pinnedImageSets": [item, long_name, good]})
    loaded = LedgerStore(store, "boot-1").load()
    assert list(loaded.ledger.sets) == ["q"]
    assert loaded.ledger.sets["q"].current_generation == 4


def test_a_state_file_over_the_bound_is_damaged_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_STATE_FILE_BYTES", 1000)
    (tmp_path / "status.json").write_text(json.dumps({"x": "y" * 2000}))
    with pytest.raises(StateFileDamaged, match="more than the 1000 allowed"):
        JsonStateStore(tmp_path).load("status")


# ---------------------------------------------------------------- nodeagent status
def run_status(tmp_path: Path, doc: object) -> int:
    (tmp_path / "var/lib/nodeagent").mkdir(parents=True)
    (tmp_path / "var/lib/nodeagent/status.json").write_text(json.dumps(doc))
    return main(["--root", str(tmp_path), "status"])


def test_status_of_an_unexpected_shape_exits_74_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_status(tmp_path, {"conditions": [1]}) == StateFileDamaged.exit_code == 74
    status_file = tmp_path / "var/lib/nodeagent/status.json"
    err = capsys.readouterr().err
    assert f"StateFileDamaged: the status file {status_file} has an unexpected shape" in err
    assert err.count(str(status_file)) == 1


def test_status_text_is_escaped_for_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_status(tmp_path, {"lastError": "\x1b]0;owned\x07" + "x" * 10_000}) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "last error: \\x1b]0;owned\\x07" in out
    assert max(len(line) for line in out.splitlines()) < 2100
