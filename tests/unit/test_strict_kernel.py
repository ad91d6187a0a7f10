"""The kernel's fixes found while hardening local inputs (issue 13); the property tests of
every parser live in tests/fuzz."""

from __future__ import annotations

import math

import pytest

from nodeagent.strict import MalformedInput, load_yaml, loads_toml


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a = " + "9" * 5000, "a number too long to read"),  # int() raised a bare ValueError
        ("a = 1e999", "1e999 is out of range"),  # tomllib returned inf
        ("a = 1" + "0" * 400 + ".0", "a number of 403 characters"),
    ],
)
def test_toml_numbers_python_cannot_hold_are_malformed(text: str, fragment: str) -> None:
    with pytest.raises(MalformedInput, match=fragment):
        loads_toml(text, what="f", max_bytes=1 << 20)


def test_toml_keeps_its_own_inf_and_nan() -> None:
    doc = loads_toml("a = inf\nb = -inf\nc = nan\nd = 1e308\n", what="f", max_bytes=1 << 20)
    assert doc["a"] == math.inf
    assert doc["b"] == -math.inf
    assert math.isnan(doc["c"])
    assert doc["d"] == 1e308


@pytest.mark.parametrize(
    "text",
    ["a: 1\na: 2\n", "{a: 1, a: 1}\n", "x:\n  - {b: 1, c: 2, b: 3}\n", "? [a]\n: 1\nb: 1\nb: 2\n"],
)
def test_yaml_duplicate_keys_are_malformed(text: str) -> None:
    with pytest.raises(MalformedInput, match="duplicate key"):
        load_yaml(text, what="f", max_bytes=1 << 20)


def test_yaml_merge_keys_may_be_overridden() -> None:
    text = "base: &b {a: 1, c: 3}\nx:\n  <<: *b\n  a: 2\n"
    assert load_yaml(text, what="f", max_bytes=1 << 20) == [
        {"base": {"a": 1, "c": 3}, "x": {"a": 2, "c": 3}}
    ]


def test_yaml_same_text_of_different_types_is_not_a_duplicate() -> None:
    assert load_yaml("1: a\n'1': b\n", what="f", max_bytes=1 << 20) == [{1: "a", "1": "b"}]


def test_json_of_escaped_quotes_that_never_closes_is_refused_in_linear_time() -> None:
    import time

    from nodeagent.strict import MalformedInput, loads_json

    text = '"' + '\\"' * 40_000  # a string-skipping regex took 25 s of CPU on this
    started = time.process_time()
    with pytest.raises(MalformedInput, match="not valid JSON"):
        loads_json(text, what="f", max_bytes=1 << 20)
    assert time.process_time() - started < 0.5
