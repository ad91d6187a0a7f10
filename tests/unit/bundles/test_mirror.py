"""Unit tests of nodeagent.bundles.mirror's wire rules: ``parse_range`` (issue 24, finding 6).

A ``Range`` of more than 4,300 digits made ``int()`` raise ``ValueError``: a 500 and a
traceback per request. Now one ``bytes=`` range of at most 19 digits a side is read, anything
else is ignored (the whole blob, RFC 9110 section 14.2), a start past the end is a 416.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.bundles.mirror import (
    MAX_RANGE_HEADER_CHARS,
    RangeNotSatisfiable,
    content_range,
    parse_range,
)

SIZE = 1000


@pytest.mark.parametrize(
    ("header", "span"),
    [
        (None, None),
        ("", None),
        ("bytes=0-9", (0, 10)),
        ("bytes=10-", (10, SIZE)),
        ("bytes=-7", (SIZE - 7, SIZE)),
        ("bytes=-5000", (0, SIZE)),  # a suffix longer than the blob: all of it
        ("bytes=990-5000", (990, SIZE)),
        (" bytes=1-2\t", (1, 3)),
        ("bytes=0-9999999999999999999", (0, SIZE)),  # 19 digits: read
        ("bytes=9-3", None),  # last before first: invalid, ignored
        ("bytes=-", None),
        ("bytes=0-1,5-6", None),  # several ranges: ignored
        ("items=0-9", None),
        ("bytes = 0-9", None),
        ("BYTES=0-9", None),
        ("bytes=\u0661-\u0662", None),  # Arabic-Indic digits are not ASCII digits
        ("bytes=0-" + "9" * 20, None),  # 20 digits: ignored unread
        ("bytes=" + "1" * 5000 + "-", None),  # issue 24: ValueError before
        ("bytes=-" + "1" * 5000, None),
        ("bytes=0-" + "1" * 5000, None),
        ("bytes=" + "0" * 5000 + "1-2", None),
        ("bytes=" + "1" * 4301 + "-" + "1" * 4301, None),
    ],
)
def test_one_bounded_range_is_read_anything_else_ignored(
    header: str | None, span: tuple[int, int] | None
) -> None:
    assert parse_range(header, SIZE) == span


@pytest.mark.parametrize(
    "header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0", "bytes=9999999999999999999-"]
)
def test_a_range_starting_past_the_end_is_not_satisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, SIZE)
    assert content_range(SIZE, None) == {"Content-Range": f"bytes */{SIZE}"}


def test_a_header_of_a_megabyte_is_ignored_at_once() -> None:
    header = "bytes=" + "9" * (1 << 20) + "-"
    started = time.process_time()
    for _ in range(100):
        assert parse_range(header, SIZE) is None
    assert time.process_time() - started < 0.05
    assert len("bytes=" + "9" * 19 + "-" + "9" * 19) <= MAX_RANGE_HEADER_CHARS


_HEADERS = st.one_of(
    st.text(max_size=200),
    st.builds(
        lambda a, b: f"bytes={a}-{b}",
        st.text("0123456789", max_size=30),
        st.text("0123456789", max_size=30),
    ),
)


@settings(max_examples=300, deadline=None)
@given(header=_HEADERS, size=st.integers(min_value=1, max_value=2**40))
def test_every_header_is_a_span_inside_the_blob_ignored_or_a_416(header: str, size: int) -> None:
    try:
        span = parse_range(header, size)
    except RangeNotSatisfiable:
        return
    if span is not None:
        start, end = span
        assert 0 <= start < end <= size
