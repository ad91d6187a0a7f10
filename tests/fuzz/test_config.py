"""Fuzz: the configuration (``config.load_config``): the main TOML file plus config.d drop-ins.

Contract: a ``Config``, or ``ConfigInvalid`` with a clipped message; no value that passes is
out of range (finite numbers).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.config import Config, load_config
from nodeagent.errors import ConfigInvalid
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

_SECTIONS = {
    name: [field.name for field in dataclasses.fields(kind)]
    for name, kind in typing.get_type_hints(Config).items()
    if dataclasses.is_dataclass(kind)
}
_KEYS = [(section, key) for section, keys in _SECTIONS.items() for key in keys]

toml_values = st.one_of(
    s.number_texts,
    st.integers().map(str),
    st.floats().map(lambda f: repr(f) if math.isfinite(f) else "nan"),
    st.sampled_from(["true", "false", '""', '"/var/lib/x"', '"10GiB"', '"-1 B"', "[]", '["/a"]',
                     '"unix:///run/crio.sock"', '"env=edge"', "{}", "1979-05-27T07:32:00Z"]),
    s.words.map(lambda w: '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'),
)  # fmt: skip


@st.composite
def config_texts(draw: st.DrawFn) -> bytes:
    lines = []
    for section, known in draw(st.lists(st.sampled_from(_KEYS), max_size=6, unique=True)):
        key = (draw(s.words) or known) if draw(st.booleans()) else known
        lines.append(f"[{section}]\n{key} = {draw(toml_values)}\n")
    text = s.utf8("".join(lines))
    return draw(st.one_of(st.just(text), s.mutated(st.just(text))))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("fuzz-config")
    (base / "config.d").mkdir()
    yield base


def _load(workdir: Path, main: bytes, dropins: list[bytes]) -> None:
    (workdir / "config.toml").write_bytes(main)
    for old in (workdir / "config.d").iterdir():
        old.unlink()
    for index, data in enumerate(dropins):
        (workdir / "config.d" / f"{index:02d}.toml").write_bytes(data)
    result = outcome(
        "config.load_config", lambda: load_config(workdir / "config.toml"), allowed=(ConfigInvalid,)
    )
    if isinstance(result, Config):
        for section in _SECTIONS:
            for value in dataclasses.asdict(getattr(result, section)).values():
                assert not isinstance(value, float) or math.isfinite(value)


@given(s.raw_bytes, st.lists(s.raw_bytes, max_size=2))
@example(b"[runtime]\ncall_timeout_s = 1e308\n", [])
@example(b"[runtime]\ncall_timeout_s = " + b"9" * 400 + b"\n", [])
@example(b"a = " + b"[" * 600 + b"]" * 600, [])
@example(b"[runtime]\nendpoint = " + b'"' + b"\x1b[2J" * 3000 + b'"', [])
def test_config_raw(workdir: Path, main: bytes, dropins: list[bytes]) -> None:
    _load(workdir, main, dropins)


@given(config_texts(), st.lists(config_texts(), max_size=2))
def test_config_documents(workdir: Path, main: bytes, dropins: list[bytes]) -> None:
    _load(workdir, main, dropins)


@given(st.lists(st.sampled_from(_KEYS), max_size=4, unique=True))
def test_config_default_values(workdir: Path, keys: list[tuple[str, str]]) -> None:
    """Sections named with no keys, or an empty file: the defaults (never pending)."""
    text = "".join(f"[{section}]\n" for section, _ in keys).encode()
    _load(workdir, text, [])
