"""Fuzz: PinnedImageSet files (``specs.parse_spec_text``), YAML and JSON, one or many
documents, ``kind: List`` included.

Contract: whatever the text, a ``SpecLoad`` (sets and problems), never an exception; every
problem's message is clipped; every set loaded is valid (1 to 500 digest references).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.specs import MAX_IMAGES, SpecLoad, parse_spec_text
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome
from tests.fuzz.test_strict import ALIAS_BOMB

_DIGEST = "sha256:" + "0123456789abcdef" * 4
_SET: dict[str, Any] = {
    "apiVersion": "machineconfiguration.openshift.io/v1",
    "kind": "PinnedImageSet",
    "metadata": {"name": "worker-pins", "labels": {"release": "4.18"}, "generation": 3},
    "spec": {"pinnedImages": [{"name": f"quay.io/openshift/app@{_DIGEST}"}]},
}
_PATHS: list[tuple[str | int, ...]] = [
    ("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"), ("metadata", "labels"),
    ("metadata", "labels", "release"), ("metadata", "generation"), ("spec",),
    ("spec", "pinnedImages"), ("spec", "pinnedImages", 0), ("spec", "pinnedImages", 0, "name"),
    ("spec", "extra"), ("status",),
]  # fmt: skip

sets = st.one_of(
    st.just(_SET),
    st.builds(s.replaced, st.just(_SET), st.sampled_from(_PATHS), s.json_like),
    st.builds(
        s.replaced, st.just(_SET), st.just(("spec", "pinnedImages")),
        st.lists(st.fixed_dictionaries({"name": s.text}), max_size=MAX_IMAGES + 2),
    ),
)  # fmt: skip


def _yaml(docs: list[Any]) -> str:
    return yaml.safe_dump_all(docs, allow_unicode=True)


documents = st.one_of(
    st.lists(sets, min_size=1, max_size=3).map(_yaml),
    st.lists(sets, max_size=3).map(lambda items: json.dumps({"kind": "List", "items": items})),
    sets.map(json.dumps),
    st.lists(sets, min_size=1, max_size=2).map(lambda items: "\n".join(map(json.dumps, items))),
)


def _parse(data: str | bytes) -> None:
    result = outcome(
        "specs.parse_spec_text",
        lambda: parse_spec_text(data, source="/etc/nodeagent/specs/fuzz.yaml", is_persistent=True),
        allowed=(),
    )
    assert isinstance(result, SpecLoad)
    for problem in result.problems:
        check_text(problem.message, f"problem {problem.reason}")
    for image_set in result.sets:
        assert 1 <= len(image_set.images) <= MAX_IMAGES


@given(s.raw_bytes)
@example(b"labels: {release: 2024-02-30}")
@example(b"a: !!int x")
@example(b"a: " + b"9" * 4301)
@example(b"[" * 600 + b"]" * 600)
@example(b'metadata: {name: "q\\ud800"}')
@example(b"")
@example(b"# only a comment\n")
@example(ALIAS_BOMB.encode())
def test_spec_raw(data: bytes) -> None:
    _parse(data)


@given(st.one_of(documents, s.mutated(documents.map(s.utf8))))
@example(_yaml([s.replaced(_SET, ("spec", "\x1f"), None)]))
@example(_yaml([s.replaced(_SET, ("metadata", "labels", "release"), "2024-02-30")]))
@example(_yaml([s.replaced(_SET, ("metadata", "name"), "x/../../outside")]))
@example(json.dumps(s.replaced(_SET, ("metadata", "name"), "q\ud800")))
def test_spec_documents(data: str | bytes) -> None:
    _parse(data)
