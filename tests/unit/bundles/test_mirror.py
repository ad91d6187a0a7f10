"""Unit tests of nodeagent.bundles.mirror: ``parse_range`` (issue 24, finding 6) and the
merged mirror drop-in (finding 9).

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
    render_mirror_dropin,
)
from nodeagent.registries import Mirror, RegistryEntry, read_registries_conf

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


# ------------------------------------------------------------------ the merged drop-in
MIRROR_HOST = "127.0.0.1:41000"
OURS = Mirror("127.0.0.1:41000/org/app", True, "digest-only")


def merged(existing: str, repository: str = "quay.io/org/app") -> RegistryEntry:
    """The drop-in's entry for ``repository``, read back as the runtime would read it."""
    conf = read_registries_conf([("registries.conf", existing)])
    text = render_mirror_dropin([repository], MIRROR_HOST, conf)
    read = read_registries_conf([("registries.conf", ""), ("99-nodeagent.conf", text)])
    (entry,) = read.entries
    return entry


def test_without_an_entry_the_repository_gets_only_the_loopback_mirror() -> None:
    assert merged("") == RegistryEntry("quay.io/org/app", "quay.io/org/app", mirrors=(OURS,))


def test_an_idms_entry_for_the_repository_is_restated_after_the_loopback_mirror() -> None:
    existing = """
[[registry]]
prefix = "quay.io/org/app"
location = "quay.io/org/app"
insecure = true
blocked = true

[[registry.mirror]]
location = "mirror.site:5000/org/app"
pull-from-mirror = "digest-only"

[[registry.mirror]]
location = "backup.site/org/app"
insecure = true
"""
    assert merged(existing) == RegistryEntry(
        "quay.io/org/app",
        "quay.io/org/app",
        is_insecure=True,
        is_blocked=True,
        mirrors=(
            OURS,
            Mirror("mirror.site:5000/org/app", False, "digest-only"),
            Mirror("backup.site/org/app", True),
        ),
    )


def test_a_shorter_prefix_is_rebased_onto_the_repository() -> None:
    existing = """
[[registry]]
prefix = "quay.io"
location = "quay.io"

[[registry]]
prefix = "quay.io/org"
location = "internal.site/quay-org"
blocked = true

[[registry.mirror]]
location = "mirror.site/quay-org"
"""
    assert merged(existing) == RegistryEntry(
        "quay.io/org/app",
        "internal.site/quay-org/app",
        is_blocked=True,
        mirrors=(OURS, Mirror("mirror.site/quay-org/app")),
    )
    assert merged(existing, "quay.io/organ/app").mirrors == (
        Mirror("127.0.0.1:41000/organ/app", True, "digest-only"),
    )  # quay.io/org is no prefix of quay.io/organ: the quay.io entry applies


def test_an_icsp_entry_becomes_the_per_mirror_form_with_the_same_pulls() -> None:
    existing = """
[[registry]]
location = "quay.io/org/app"
mirror-by-digest-only = true

[[registry.mirror]]
location = "mirror.site/org/app"
"""
    entry = merged(existing)
    assert not entry.is_mirror_by_digest_only  # never both forms in one entry
    assert entry.mirrors == (OURS, Mirror("mirror.site/org/app", False, "digest-only"))


def test_a_wildcard_entry_applies_to_its_subdomains() -> None:
    existing = """
[[registry]]
prefix = "*.example.com"
insecure = true

[[registry.mirror]]
location = "mirror.site"
"""
    entry = merged(existing, "reg.example.com/team/app")
    assert (entry.location, entry.is_insecure) == ("reg.example.com/team/app", True)
    assert entry.mirrors[1:] == (Mirror("mirror.site/team/app"),)
    assert merged(existing, "example.com/team/app").mirrors[1:] == ()


def test_docker_hub_aliases_match_its_normalized_name() -> None:
    existing = '[[registry]]\nprefix = "index.docker.io/library"\nlocation = "hub.site/lib"\n'
    entry = merged(existing, "docker.io/library/busybox")
    assert entry.location == "hub.site/lib/busybox"
