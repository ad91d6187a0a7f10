"""Other components' CRI-O files: read strictly and within bounds; a broken one is named with
its reason code and never stops nodeagent's own pins (issue 13)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.crio_config import CrioDropins, read_config_file
from nodeagent.errors import RuntimeConfigInvalid
from nodeagent.pins import (
    MAX_FOREIGN_PATTERNS,
    MAX_PATTERN_CHARS,
    MAX_RUNTIME_CONFIG_BYTES,
    ConfigFile,
    PinService,
    foreign_pins,
    pinned_images_of,
)
from tests.fakes.crio import FakeCrio, MemoryDropins, crio_config
from tests.fakes.reloader import RecordingReloader

OURS = "quay.io/ns/ours@sha256:" + "a" * 64
THEIRS = "quay.io/ns/theirs@sha256:" + "b" * 64
MCD = "/etc/crio/crio.conf.d/50-pinned-images"

# (file text, what the refusal says): every one a file CRI-O could not load or nodeagent
# will not carry; none may raise anything but ValueError.
BROKEN = [
    ("[crio.image\npinned_images = [", "not valid TOML"),
    ("[crio.image]\npinned_images = [" + "[" * 600 + "]" * 600 + "]\n", "TOML"),
    ("[crio.image]\npinned_images = " + "9" * 5000 + "\n", "too long"),
    ("[crio.image]\nx = 1e999\n", "out of range"),
    ('[crio.image]\npinned_images = ["q\\ud800"]\n', "not valid TOML"),
    ('[crio.image]\npinned_images = "a"\n', "must be a list of strings, got 'a'"),
    ("[crio.image]\npinned_images = [1, 2]\n", "must be a list of strings, got a list"),
    ("[crio.image]\npinned_images = [{a = 1}]\n", "must be a list of strings"),
    ("crio = 1\n", "crio must be a table"),
    ("[crio]\nimage = []\n", "crio.image must be a table"),
    ('[crio.image]\npinned_images = ["' + "x" * (MAX_PATTERN_CHARS + 1) + '"]\n', "pattern"),
    (crio_config(["a"] * (MAX_FOREIGN_PATTERNS + 1)), "too many"),
    ('[crio.image]\nx = "' + "y" * MAX_RUNTIME_CONFIG_BYTES + '"\n', "allowed"),
]


@pytest.mark.parametrize(("text", "fragment"), BROKEN)
def test_a_broken_file_is_a_value_error_with_a_short_message(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)) as caught:
        pinned_images_of(text)
    assert len(str(caught.value)) < 400


def test_not_utf8_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="not UTF-8"):
        pinned_images_of(b'[crio.image]\npinned_images = ["\xff"]\n')


def test_a_broken_file_is_a_problem_naming_it_and_the_others_still_count() -> None:
    foreign = foreign_pins(
        [
            ConfigFile(MCD, crio_config([THEIRS]), is_after_ours=False),
            ConfigFile("/etc/crio/crio.conf.d/60-x", "pinned_images = [" * 600, False),
            ConfigFile("/etc/crio/crio.conf.d/61-y", "", False, error="is not UTF-8 (invalid)"),
        ]
    )
    assert foreign.patterns == (THEIRS,)
    assert [p.path for p in foreign.problems] == [
        "/etc/crio/crio.conf.d/60-x",
        "/etc/crio/crio.conf.d/61-y",
    ]
    assert foreign.problems[0].message.startswith("/etc/crio/crio.conf.d/60-x: ")
    assert foreign.problems[1].message == "/etc/crio/crio.conf.d/61-y: is not UTF-8 (invalid)"
    assert foreign.unreadable_files == tuple(p.path for p in foreign.problems)


def test_a_broken_file_keeps_its_pins_of_the_last_good_read() -> None:
    good = foreign_pins([ConfigFile(MCD, crio_config([THEIRS, "*"]), is_after_ours=False)])
    assert good.by_file == {MCD: (THEIRS,)}
    broken = foreign_pins([ConfigFile(MCD, "[crio.image\n", False)], good.by_file)
    assert broken.patterns == (THEIRS,)
    assert broken.problems[0].kept_patterns == (THEIRS,)
    assert broken.by_file == {}


async def test_the_service_renders_its_own_pins_and_names_a_broken_file_once() -> None:
    runtime = FakeCrio()
    store = MemoryDropins([ConfigFile(MCD, crio_config([THEIRS]), is_after_ours=False)])
    service = PinService(store, RecordingReloader(store, runtime), runtime)
    await service.write([OURS], is_runtime_running=False)
    store.others = [ConfigFile(MCD, '[crio.image]\npinned_images = ["half', False)]
    with capture_logs() as logs:
        await service.write([OURS], is_runtime_running=False)
        await service.write([OURS], is_runtime_running=False)
    assert store.text is not None
    assert pinned_images_of(store.text) == sorted([OURS, THEIRS])
    warnings = [e for e in logs if e["event"] == "runtime_config_invalid"]
    assert len(warnings) == 1
    assert warnings[0]["reason"] == RuntimeConfigInvalid.reason == "RuntimeConfigInvalid"
    assert warnings[0]["file"] == MCD
    assert warnings[0]["pins_kept"] == 1
    store.others = [ConfigFile(MCD, crio_config([]), is_after_ours=False)]
    with capture_logs() as logs:
        await service.write([OURS], is_runtime_running=False)
    assert [e["event"] for e in logs if e["event"].startswith("runtime_config")] == [
        "runtime_config_valid_again"
    ]
    assert pinned_images_of(store.text) == [OURS]


# ---------------------------------------------------------------- reading from disk
def test_reading_a_dangling_link_a_big_file_and_non_utf8_gives_errors(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "big").write_bytes(b"#" * (MAX_RUNTIME_CONFIG_BYTES + 1))
    (tmp_path / "latin1").write_bytes(b"# caf\xe9\n")
    errors = {
        name: read_config_file(tmp_path / name, is_after_ours=False)
        for name in ("dangling", "big", "latin1", "absent")
    }
    assert errors["absent"] is None
    assert {name: file.error for name, file in errors.items() if file is not None} == {
        "dangling": "a dangling link",
        "big": f"is more than the {MAX_RUNTIME_CONFIG_BYTES} bytes nodeagent reads",
        "latin1": "is not UTF-8 (invalid continuation byte)",
    }


def test_render_pins_writes_our_pins_beside_a_broken_foreign_dropin(tmp_path: Path) -> None:
    conf_d = tmp_path / "etc/crio/crio.conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "50-pinned-images").write_bytes(b"[crio.image]\npinned_images = [\x1b[2J")
    (conf_d / "60-good").write_text(crio_config([THEIRS]))
    # A process of its own: render-pins configures logging for its stderr.
    done = subprocess.run(
        [sys.executable, "-m", "nodeagent", "--root", str(tmp_path), "render-pins", "--write"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert f"warning: RuntimeConfigInvalid: {conf_d / '50-pinned-images'}: " in err
    assert "\x1b" not in err
    dropins = CrioDropins(
        tmp_path / "etc/crio/crio.conf",
        conf_d,
        tmp_path / "run/crio/crio.conf.d",
        "99-nodeagent-pinned-images.conf",
    )
    text = dropins.read_dropin()
    assert text is not None
    assert pinned_images_of(text) == [THEIRS]
    assert dropins.link.readlink() == dropins.target
