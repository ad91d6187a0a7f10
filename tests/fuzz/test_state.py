"""Fuzz: nodeagent's own state files, which a crash, a full disk or a person may damage:
the ledger, its last good copy, the boot pins and the published status
(``ledger.LedgerStore.load`` over ``adapters.files.JsonStateStore``).

Contract: ``load`` never fails on a damaged document: it rebuilds, and names each damaged
file in a repair whose message is clipped; ``JsonStateStore.load`` returns an object or
raises ``StateFileDamaged``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.adapters.files import JsonStateStore
from nodeagent.errors import HostFileError
from nodeagent.ledger.store import BOOT_PINS, LAST_GOOD, LEDGER, STATUS, LedgerStore, LoadedLedger
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome

_BOOT = "0f6d2c1e-boot"
_IMAGE = "quay.io/acme/app@sha256:" + "a" * 64
_LEDGER: dict[str, Any] = {
    "bootId": _BOOT,
    "sets": {"apps": {"desiredGeneration": 2, "currentGeneration": 2, "persistent": True,
                      "pinnedImages": [_IMAGE], "fingerprint": "f", "source": "/etc/x.yaml"}},
}  # fmt: skip
_STATUS: dict[str, Any] = {
    "bootId": _BOOT,
    "pinnedImageSets": [{"name": "apps", "desiredGeneration": 2, "currentGeneration": 2,
                         "persistent": True, "source": "/etc/x.yaml"}],
}  # fmt: skip
_BOOT_PINS: dict[str, Any] = {"bootId": _BOOT, "images": [_IMAGE]}
_PATHS: list[tuple[str | int, ...]] = [
    ("bootId",), ("sets",), ("sets", "apps"), ("sets", "apps", "desiredGeneration"),
    ("sets", "apps", "currentGeneration"), ("sets", "apps", "persistent"),
    ("sets", "apps", "pinnedImages"), ("sets", "apps", "pinnedImages", 0),
    ("sets", "apps", "lastFailedError"), ("sets", "other"),
]  # fmt: skip


def _documents(base: dict[str, Any], paths: list[tuple[str | int, ...]]) -> Any:
    return st.one_of(
        st.just(base),
        st.builds(s.replaced, st.just(base), st.sampled_from(paths), s.json_like),
    ).map(lambda doc: s.utf8(json.dumps(doc)))


files = st.one_of(
    st.none(),  # missing
    s.raw_bytes,
    s.mutated(_documents(_LEDGER, _PATHS)),
    st.just(b""),
    st.just(b"[]"),
)
ledgers = st.one_of(files, _documents(_LEDGER, _PATHS))
statuses = st.one_of(
    files,
    _documents(_STATUS, [("pinnedImageSets",), ("pinnedImageSets", 0),
                         ("pinnedImageSets", 0, "name"), ("pinnedImageSets", 0, "persistent"),
                         ("pinnedImageSets", 0, "desiredGeneration"), ("bootId",)]),
)  # fmt: skip
boot_pins = st.one_of(files, _documents(_BOOT_PINS, [("images",), ("images", 0), ("bootId",)]))


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fuzz-state")


def _write(directory: Path, name: str, data: bytes | None) -> None:
    path = directory / f"{name}.json"
    if data is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(data)


@given(ledgers, ledgers, statuses, boot_pins)
@example(b"", None, None, None)
@example(b"\xff\xfe", b"[]", None, None)
@example(
    s.utf8(json.dumps(s.replaced(_LEDGER, ("sets", "apps", "pinnedImages"), "abc"))),
    None,
    None,
    None,
)
@example(
    s.utf8(json.dumps(s.replaced(_LEDGER, ("sets", "apps", "desiredGeneration"), 10**400))),
    None,
    None,
    None,
)
@example(b"[" * 100_000 + b"]" * 100_000, None, None, None)
@example(s.utf8(json.dumps({"bootId": _BOOT, "sets": {"\x1b[2J" * 2000: 1}})), None, None, None)
def test_ledger_load(
    state_dir: Path, ledger: bytes | None, last_good: bytes | None, status: bytes | None,
    pins: bytes | None,
) -> None:  # fmt: skip
    for name, data in ((LEDGER, ledger), (LAST_GOOD, last_good), (STATUS, status),
                       (BOOT_PINS, pins)):  # fmt: skip
        _write(state_dir, name, data)
    store = LedgerStore(JsonStateStore(state_dir), _BOOT)
    result = outcome("ledger.LedgerStore.load", lambda: store.load(is_repairing=False))
    assert isinstance(result, LoadedLedger), result
    for repair in result.repairs:
        check_text(repair.message, f"repair of {repair.file}")


@given(files)
def test_state_file(state_dir: Path, data: bytes | None) -> None:
    _write(state_dir, "fuzz", data)
    outcome("files.JsonStateStore.load", lambda: JsonStateStore(state_dir).load("fuzz"),
            allowed=(HostFileError,))  # fmt: skip
