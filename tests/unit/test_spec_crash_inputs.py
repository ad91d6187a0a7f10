"""The spec inputs that once crashed the first sync (issue 13): each is one SpecInvalid
problem with a short, escaped message, and the good set next to it still loads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nodeagent.errors import SpecInvalid
from nodeagent.specs import load_spec_dirs, parse_spec_text

API = "machineconfiguration.openshift.io/v1"
IMAGE = "quay.io/ns/app@sha256:" + "1" * 64
HEAD = f"apiVersion: {API}\nkind: PinnedImageSet\n"
GOOD = HEAD + f"metadata: {{name: good}}\nspec: {{pinnedImages: [{{name: '{IMAGE}'}}]}}\n"


def spec(metadata: str, images: str = f"[{{name: '{IMAGE}'}}]") -> str:
    return HEAD + f"metadata: {metadata}\nspec: {{pinnedImages: {images}}}\n"


def alias_bomb() -> str:
    """~490 bytes that expand to ~10^9 values (the issue's 537 MiB error message)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 9):
        prev = chr(ord("a") + level - 1)
        name = chr(ord("a") + level)
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def json_spec(body: str) -> str:
    return (
        '{"apiVersion": "' + API + '", "kind": "PinnedImageSet", "metadata": ' + body + ", "
        '"spec": {"pinnedImages": [{"name": "' + IMAGE + '"}]}}'
    )


# (file text, a fragment of the problem's message)
CRASH_INPUTS = [
    (spec("{name: x, labels: {release: 2024-02-30}}"), None),  # a label value, a string
    ("a: !!int x\n", "'x' is not an integer"),
    (spec("{name: x, generation: " + "9" * 4301 + "}"), "an integer of 4301 digits"),
    (spec("{name: x, generation: 1" + "0" * 400 + "}"), "an integer of 401 digits"),
    ("[" * 600 + "]" * 600, "nested more than 32 deep"),
    ("{a: " * 600 + "1" + "}" * 600, "nested more than 32 deep"),
    (spec('{name: "q\\ud800"}'), "invalid Unicode character escape"),
    (alias_bomb(), "expands to more than"),
    (spec("{name: x, labels: {a: '" + "v" * 10_000_000 + "'}}"), "more than the"),
    (spec("{name: '" + "v" * 3_000_000 + "'}"), "is not a DNS subdomain"),
    (spec("{name: x, generation: .nan}"), "NaN and infinity are refused"),
    (spec("{name: x, generation: .inf}"), "NaN and infinity are refused"),
    (spec("{name: x, labels: !!binary aGVsbG8=}"), "is refused"),
    (spec("{name: x, labels: !!python/object:os.system {}}"), "is refused"),
    (spec("{name: x, labels: !!set {a, b}}"), "is refused"),
    (spec("{name: x, labels: {a: !!bool maybe}}"), "'maybe' is not a boolean"),
    (spec("{name: x, labels: {a: !!float x}}"), "'x' is not a number"),
    (spec("{name: x, labels: {a: b, a: c}}"), "duplicate key"),
    (json_spec('{"name": "x", "generation": NaN}'), "generation must be a non-negative"),
    (json_spec('{"name": "x", "name": "y"}'), "duplicate key"),
    (json_spec('{"name": "x", "labels": {"a": 1e999}}'), None),  # YAML 1.1: a string
    (json_spec('{"name": "x", "labels": {"a": "\\u001b[2J"}}'), None),  # a string: valid
    (spec("{name: x, labels: {a: &r [*r]}}"), "refers to itself"),
    (b"\xff\xfe" + "apiVersion: v1\n".encode("utf-16-le"), "not UTF-8"),
    (b"apiVersion: \xe9t\xe9\n", "not UTF-8"),
    ("a: 'x\x00y'\n", "NUL"),
    ("a: 'x\x1b[2Jy'\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "fragment"), CRASH_INPUTS)
def test_a_crash_input_is_one_spec_invalid_problem_with_a_clipped_message(
    text: str | bytes, fragment: str | None
) -> None:
    started = time.monotonic()
    load = parse_spec_text(
        text, source="/etc/nodeagent/pinnedimagesets.d/x.yaml", is_persistent=True
    )
    assert time.monotonic() - started < 10
    if fragment is None:  # valid after all: the value stays a string
        assert [s.name for s in load.sets] == ["x"]
        return
    assert load.sets == ()
    assert len(load.problems) == 1
    problem = load.problems[0]
    assert problem.reason == SpecInvalid.reason
    assert fragment in problem.message
    assert len(problem.message) < 1000
    assert "\x1b" not in problem.message
    assert all(not 0xD800 <= ord(c) <= 0xDFFF for c in problem.message)


def test_the_impossible_date_stays_a_string_label() -> None:
    load = parse_spec_text(
        spec("{name: x, labels: {release: 2024-02-30}}"), source="f", is_persistent=True
    )
    assert dict(load.sets[0].labels) == {"release": "2024-02-30"}


@pytest.mark.parametrize(("text", "fragment"), [c for c in CRASH_INPUTS if c[1] is not None])
def test_the_good_set_in_the_next_file_still_loads(
    tmp_path: Path, text: str | bytes, fragment: str
) -> None:
    (tmp_path / "10-bad.yaml").write_bytes(text.encode() if isinstance(text, str) else text)
    (tmp_path / "20-good.yaml").write_text(GOOD)
    load = load_spec_dirs([(tmp_path, True)])
    assert [s.name for s in load.sets] == ["good"]
    assert [p.source for p in load.problems] == [str(tmp_path / "10-bad.yaml")]


@pytest.mark.parametrize(
    "text",
    [
        "a: !!int x\n",  # the file is not YAML
        spec("{name: x}", images="[{name: 'q\x1b[2J'}]"),  # a set in it is invalid
        spec("{name: x}", images="[{name: '" + IMAGE + "', " + "k" * 100_000 + ": 1}]"),
        HEAD + "metadata: {name: x}\nspec: {" + "f" * 3_000_000 + ": 1}\n",
        HEAD + "metadata: [" + "1, " * 300_000 + "1]\nspec: {}\n",
        GOOD + "---\n" + GOOD,  # a set defined twice
    ],
)
def test_file_names_and_values_are_escaped_and_clipped_in_messages(
    tmp_path: Path, text: str
) -> None:
    (tmp_path / "a\x1b[2J.yaml").write_text(text)
    load = load_spec_dirs([(tmp_path, True)])
    assert load.problems
    for problem in load.problems:
        assert "\x1b" not in problem.message
        assert len(problem.message) < 1000


def test_a_json_spec_loads_when_it_is_strict() -> None:
    load = parse_spec_text(json_spec('{"name": "x"}'), source="f.yaml", is_persistent=True)
    assert [s.name for s in load.sets] == ["x"]
    assert json.loads(json_spec('{"name": "x"}'))["metadata"] == {"name": "x"}
