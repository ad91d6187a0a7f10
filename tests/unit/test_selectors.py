"""Label selectors: the kubectl string form and the LabelSelector object form."""

from __future__ import annotations

import pytest

from nodeagent.errors import ConfigInvalid
from nodeagent.selectors import NOTHING, parse_selector, selector_from_object

LABELS = {"env": "edge", "zone": "b", "gpu": "", "node-role.kubernetes.io/worker": ""}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("env=edge", True),
        ("env==edge", True),
        ("env=core", False),
        ("env!=core", True),
        ("env!=edge", False),
        ("missing!=x", True),
        ("gpu", True),
        ("!gpu", False),
        ("!legacy", True),
        ("zone in (a,b)", True),
        ("zone in (a, c)", False),
        ("zone notin (a,c)", True),
        ("zone notin (b)", False),
        ("missing notin (b)", True),
        ("env=edge, zone in (a,b), !legacy", True),
        ("env=edge,zone in (a,c)", False),
        ("node-role.kubernetes.io/worker", True),
        ("node-role.kubernetes.io/worker=", True),
    ],
)
def test_string_selector(text: str, matches: bool) -> None:
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("env=edge,", "empty requirement"),
        ("env=a b", "not a label value"),
        ("-bad=x", "not a label key"),
        ("zone in (a,,b)", "empty value"),
        ("zone in ()", "empty value"),
    ],
)
def test_invalid_string_selector_names_the_problem(text: str, why: str) -> None:
    with pytest.raises(ConfigInvalid, match=why) as caught:
        parse_selector(text)
    assert "kubectl -l" in caught.value.message


def test_string_form_round_trips() -> None:
    text = "env=edge,tier!=test,gpu,!legacy,zone in (a,b)"
    assert str(parse_selector(text)) == text
    assert str(parse_selector("")) == "(everything)"


@pytest.mark.parametrize(
    ("obj", "matches"),
    [
        ({}, True),
        ({"matchLabels": {"env": "edge"}}, True),
        ({"matchLabels": {"env": "core"}}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"node-role.kubernetes.io/worker": ""},
                "matchExpressions": [{"key": "env", "operator": "In", "values": ["edge"]}],
            },
            True,
        ),
    ],
)
def test_object_selector(obj: dict[str, object], matches: bool) -> None:
    assert selector_from_object(obj).matches(LABELS) is matches


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "env=edge",
        {"matchLabels": ["env"]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]},
        {"matchExpressions": [{"key": "gpu", "operator": "Exists", "values": ["x"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "Like"}]},
    ],
)
def test_missing_or_malformed_object_selects_nothing(obj: object) -> None:
    selector = selector_from_object(obj)
    assert selector == NOTHING
    assert not selector.matches(LABELS)
    assert not selector.matches({})
