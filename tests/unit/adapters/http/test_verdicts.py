"""Unit tests of the manifest verdict memory (issue 24, finding 5): keyed by digest and the
file's stamp, bounded by entries and by body bytes, least recently used out first."""

from __future__ import annotations

from nodeagent.adapters.http.verdicts import ManifestVerdicts, Verdict

STAMP = (1, 2, 300, 4, 5)


def test_a_verdict_holds_only_for_the_file_version_it_was_read_from() -> None:
    verdicts = ManifestVerdicts()
    verdicts.put("sha256:a", Verdict(STAMP))
    assert verdicts.get("sha256:a", STAMP) == Verdict(STAMP)
    assert verdicts.get("sha256:a", (1, 9, 300, 4, 5)) is None  # another inode: replaced
    assert verdicts.get("sha256:a", (1, 2, 300, 4, 6)) is None  # another ctime: rewritten
    assert verdicts.get("sha256:b", STAMP) is None


def test_entries_are_bounded_least_recently_used_first_out() -> None:
    verdicts = ManifestVerdicts(max_entries=3)
    for name in "abc":
        verdicts.put(name, Verdict(STAMP))
    assert verdicts.get("a", STAMP) is not None  # a is used: b is now the oldest
    verdicts.put("d", Verdict(STAMP))
    assert [n for n in "abcd" if verdicts.get(n, STAMP) is not None] == ["a", "c", "d"]
    assert len(verdicts) == 3


def test_manifest_bodies_are_bounded_in_bytes() -> None:
    verdicts = ManifestVerdicts(max_body_bytes=10)
    verdicts.put("a", Verdict(STAMP, b"12345", "m"))
    verdicts.put("b", Verdict(STAMP, b"1234", "m"))
    verdicts.put("none", Verdict(STAMP))  # no body: costs no body bytes
    assert verdicts.body_bytes == 9
    verdicts.put("c", Verdict(STAMP, b"123", "m"))  # over 10: a (the oldest) goes
    assert verdicts.get("a", STAMP) is None
    assert verdicts.body_bytes == 7
    verdicts.put("huge", Verdict(STAMP, b"x" * 11, "m"))  # never fits: not kept
    assert verdicts.get("huge", STAMP) is None
    assert verdicts.body_bytes == 7
    verdicts.put("b", Verdict(STAMP))  # replaced: its body bytes are given back
    assert verdicts.body_bytes == 3
    verdicts.keep_only({"c"})
    assert (len(verdicts), verdicts.body_bytes) == (1, 3)
