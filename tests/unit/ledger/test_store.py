"""LedgerStore and save_repairing over the real JSON state store in a temp directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.files import JsonStateStore
from nodeagent.errors import HostFileError
from nodeagent.ledger import Ledger, LedgerStore, save_repairing

A = "r.io/ns/a@sha256:" + "a" * 64
B = "r.io/ns/b@sha256:" + "b" * 64


def pinned_ledger() -> Ledger:
    ledger = Ledger("boot-1")
    ledger.observe_spec("p", "f", 3, is_persistent=True, source="/d/p.yaml")
    ledger.record_pinned("p", 3, [A])
    ledger.observe_spec("t", "f", None, is_persistent=False, source="/run/t.yaml")
    ledger.record_pinned("t", 1, [B])
    return ledger


def test_save_writes_the_ledger_then_its_last_good_copy_then_the_persistent_boot_pins(
    tmp_path: Path,
) -> None:
    store = JsonStateStore(tmp_path)
    LedgerStore(store, "boot-1").save(pinned_ledger())
    assert store.load("ledger.last-good") == store.load("ledger") == pinned_ledger().to_json()
    assert store.load("boot-pins") == {"bootId": "boot-1", "images": [A]}


def test_a_directory_in_the_way_of_a_copy_is_set_aside_and_the_copy_written(
    tmp_path: Path,
) -> None:
    store = JsonStateStore(tmp_path)
    (tmp_path / "ledger.last-good.json").mkdir()
    with capture_logs() as logs:
        LedgerStore(store, "boot-1").save(pinned_ledger())
    assert store.load("ledger.last-good") == pinned_ledger().to_json()
    assert len(list(tmp_path.glob("ledger.last-good.json.damaged-*"))) == 1
    assert [e["file"] for e in logs if e["event"] == "state_file_damaged"] == ["ledger.last-good"]


class FullDisk(JsonStateStore):
    def save(self, name: str, obj: dict[str, Any]) -> bool:
        raise HostFileError(f"cannot write {name}: No space left on device")


def test_a_full_disk_is_no_damage_nothing_is_moved(tmp_path: Path) -> None:
    JsonStateStore(tmp_path).save("status", {"a": 1})
    with pytest.raises(HostFileError, match="No space left"):
        save_repairing(FullDisk(tmp_path), "status", {"a": 2})
    assert JsonStateStore(tmp_path).load("status") == {"a": 1}
    assert list(tmp_path.glob("*.damaged-*")) == []


def test_load_after_a_reboot_drops_transient_sets_and_says_where_it_came_from(
    tmp_path: Path,
) -> None:
    store = JsonStateStore(tmp_path)
    LedgerStore(store, "boot-1").save(pinned_ledger())
    loaded = LedgerStore(store, "boot-2").load()
    assert (loaded.origin, loaded.repairs) == ("ledger", ())
    assert list(loaded.ledger.sets) == ["p"]
    assert loaded.remembered_pins() == {A}


def test_a_node_without_any_state_is_new_not_rebuilt(tmp_path: Path) -> None:
    loaded = LedgerStore(JsonStateStore(tmp_path), "boot-1").load()
    assert (loaded.origin, loaded.is_rebuilt, loaded.repairs) == ("new", False, ())


def test_read_only_load_reports_damage_and_moves_nothing(tmp_path: Path) -> None:
    store = JsonStateStore(tmp_path)
    LedgerStore(store, "boot-1").save(pinned_ledger())
    (tmp_path / "ledger.json").write_text("[]")
    loaded = LedgerStore(store, "boot-1").load(is_repairing=False)
    assert loaded.origin == "last-good"
    assert [(r.file, r.moved_to) for r in loaded.repairs] == [("ledger", None)]
    assert (tmp_path / "ledger.json").read_text() == "[]"
    assert loaded.remembered_pins() == {A, B}


@pytest.mark.parametrize(
    "damage", [b"", b"\xff\xfe{\x00", b"[]\n", b'{"bootId": "boot-1", "sets": {"p": 5}}']
)
def test_a_ledger_damaged_while_the_daemon_ran_is_kept_aside_before_it_is_replaced(
    tmp_path: Path, damage: bytes
) -> None:
    store = JsonStateStore(tmp_path)
    ledgers = LedgerStore(store, "boot-1")
    ledgers.save(pinned_ledger())
    (tmp_path / "ledger.json").write_bytes(damage)
    with capture_logs() as logs:
        ledgers.save(pinned_ledger())
    assert store.load("ledger") == pinned_ledger().to_json()
    kept = list(tmp_path.glob("ledger.json.damaged-*"))
    assert [path.read_bytes() for path in kept] == [damage]
    assert [e["file"] for e in logs if e["event"] == "state_file_damaged"] == ["ledger"]
    assert [r.file for r in ledgers.late_repairs] == ["ledger"]
    assert ledgers.late_repairs[0].moved_to is not None


def test_an_intact_ledger_on_disk_is_replaced_without_a_repair(tmp_path: Path) -> None:
    ledgers = LedgerStore(JsonStateStore(tmp_path), "boot-1")
    ledgers.save(pinned_ledger())
    with capture_logs() as logs:
        ledgers.save(pinned_ledger())
    assert ledgers.late_repairs == []
    assert [e for e in logs if e["event"] == "state_file_damaged"] == []
