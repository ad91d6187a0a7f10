"""Fuzz: image references (``references.parse_pinned_image_ref``, ``registries`` docker
references) and label selectors (``selectors``).

Contract: a value, or ``ImageReferenceInvalid`` / ``ConfigInvalid`` with a clipped message;
``selector_from_object`` never raises (a malformed selector selects nothing).
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.errors import ConfigInvalid, ImageReferenceInvalid
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries import parse_docker_digest_reference, parse_docker_reference
from nodeagent.selectors import Selector, parse_selector, selector_from_object
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

_DIGEST = "sha256:" + "0123456789abcdef" * 4
_REFS = [
    f"quay.io/openshift/app@{_DIGEST}",
    f"registry.example.com:5000/team/app@{_DIGEST}",
    f"localhost/app:v1@{_DIGEST}",
    "docker.io/library/busybox:1.36",
    "busybox",
]
references = st.one_of(
    s.text,
    s.edited_text(_REFS),
    st.builds(lambda a, b: a + b, st.sampled_from(_REFS), s.text),
)


@given(references)
@example("quay.io/\x1b[2J@" + _DIGEST)
@example("a." * 200 + "io/x@" + _DIGEST)
def test_pinned_image_ref(text: str) -> None:
    result = outcome(
        "references.parse_pinned_image_ref",
        lambda: parse_pinned_image_ref(text),
        allowed=(ImageReferenceInvalid,),
    )
    if not isinstance(result, BaseException):
        assert str(result).endswith(result.digest)


@given(references)
@example("x@sha256:" + "a" * 5000 + "!")
def test_docker_reference(text: str) -> None:
    outcome(
        "registries.parse_docker_reference",
        lambda: parse_docker_reference(text),
        allowed=(ImageReferenceInvalid,),
    )
    outcome(
        "registries.parse_docker_reference",
        lambda: parse_docker_digest_reference(text),
        allowed=(ImageReferenceInvalid,),
    )


_SELECTORS = ["env=edge,tier!=test", "zone in (a,b),!legacy", "node-role.kubernetes.io/worker"]
selectors = st.one_of(
    s.text,
    s.edited_text(_SELECTORS),
    s.deep("(", ")"),
)  # fmt: skip


@given(selectors)
@example("x=" + "\x1b[2J" * 5000)
@example("a in (" + "b," * 20000 + "c)")
def test_parse_selector(text: str) -> None:
    result = outcome(
        "selectors.parse_selector", lambda: parse_selector(text), allowed=(ConfigInvalid,)
    )
    assert isinstance(result, Selector | ConfigInvalid)


@given(
    st.one_of(
        s.json_like,
        st.fixed_dictionaries(
            {"matchLabels": s.json_like, "matchExpressions": st.lists(s.json_like, max_size=3)}
        ),
        st.fixed_dictionaries(
            {"matchExpressions": st.lists(st.fixed_dictionaries({
                "key": s.json_like, "operator": st.sampled_from(["In", "NotIn", "Exists", "Gt"]),
                "values": s.json_like,
            }), max_size=3)}
        ),
    )
)  # fmt: skip
def test_selector_from_object(obj: object) -> None:
    result = outcome(
        "selectors.selector_from_object", lambda: selector_from_object(obj), allowed=()
    )
    assert isinstance(result, Selector)
