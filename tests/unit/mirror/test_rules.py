"""The node mirror's pure rules: routes, credentials, misses, its board and its reports."""

from __future__ import annotations

import base64

import pytest

from nodeagent.bundles.mirror import ErrorAnswer, Fetch
from nodeagent.mirror.board import MAX_RECENT_MISSING, MirrorBoard
from nodeagent.mirror.credentials import (
    MAX_VERIFIERS,
    is_allowed,
    parse_verifiers,
    presented_verifier,
    render_verifiers,
    verifier_of,
)
from nodeagent.mirror.misses import Misses
from nodeagent.mirror.routes import MAX_PATH_CHARS, UnknownName, route_node
from nodeagent.mirror.state import MirrorReport
from nodeagent.site.reports import (
    MissingReport,
    parse_report,
    render_mirror,
    render_missing,
)

DIGEST = "sha256:" + "ab" * 32
HELD = frozenset({"example/app", "team/tools"})


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v2/" + "a/" * (MAX_PATH_CHARS // 2) + f"blobs/{DIGEST}", 414),
        ("PUT", f"/v2/example/app/blobs/{DIGEST}", 405),
        ("GET", "/v2/_catalog", 404),
        ("GET", "/v2/../etc/passwd", 404),
        ("GET", f"/v2/Example/App/blobs/{DIGEST}", 400),
    ],
)
def test_refused_requests(method: str, path: str, status: int) -> None:
    answer = route_node(method, path, HELD)
    assert isinstance(answer, ErrorAnswer) and answer.status == status


def test_a_name_not_held_is_unknown_its_digest_still_seen() -> None:
    answer = route_node("GET", f"/v2/not/held/manifests/{DIGEST}", HELD)
    assert answer == UnknownName(Fetch("manifests", DIGEST))


def test_held_names_by_digest_and_signature_tags() -> None:
    assert route_node("GET", f"/v2/example/app/blobs/{DIGEST}", HELD) == Fetch("blobs", DIGEST)
    assert route_node("HEAD", f"/v2/team/tools/manifests/{DIGEST}", HELD) == Fetch(
        "manifests", DIGEST
    )
    tag = f"sha256-{'ab' * 32}.sig"
    target = route_node("GET", f"/v2/example/app/manifests/{tag}", HELD)
    assert isinstance(target, Fetch) and target.kind == "signature"
    assert target.name == f"example/app/{tag}"
    assert route_node("GET", "/v2/", HELD) == Fetch("base")


def test_credentials_match_only_their_verifier() -> None:
    verifiers = parse_verifiers(render_verifiers([verifier_of("u", "p"), verifier_of("c", "d")]))
    assert is_allowed(basic("u:p"), verifiers) and is_allowed(basic("c:d"), verifiers)
    for wrong in (
        None,
        "",
        basic("u:q"),
        basic("u"),
        "Bearer x",
        "Basic %%%",
        basic("u:p") + "A" * 2000,
    ):
        assert not is_allowed(wrong, verifiers)
    assert presented_verifier("basic " + basic("u:p").split()[1]) == verifier_of("u", "p")
    assert not is_allowed(basic("u:p"), frozenset())


def test_verifier_files_are_read_strictly() -> None:
    good = verifier_of("u", "p")
    data = f"{good}\nsha256:XYZ\nnot a line\n{'x' * 5000}\n".encode()
    assert parse_verifiers(data) == {good}
    many = render_verifiers([verifier_of("u", str(i)) for i in range(40)])
    assert len(parse_verifiers(many)) == MAX_VERIFIERS


def test_misses_are_logged_once_a_minute_each_and_bounded() -> None:
    misses = Misses(log_every_s=60.0, max_tracked=4)
    assert misses.note("a", 0.0) == 1
    assert misses.note("a", 10.0) is None and misses.note("a", 59.0) is None
    assert misses.note("a", 61.0) == 3  # the two not logged, and this one
    for name in "bcdef":
        misses.note(name, 70.0)
    assert misses.total == 9 and misses.recent() == ("f", "e", "d", "c")


def test_reports_round_trip_and_are_strict() -> None:
    report = MirrorReport(True, 7, 3, 120, 1 << 30, 2, 1)
    assert parse_report(render_mirror(report)) == report
    assert parse_report(render_missing(DIGEST)) == MissingReport(DIGEST)
    for bad in (
        b"mirror on 1 2 3 4 5",
        b"mirror maybe 1 2 3 4 5 6",
        b"mirror on 01 2 3 4 5 6",
        b"mirror on 1 2 3 4 5 6 ",
        b"missing sha256:" + b"AB" * 32,
        b"mirror on " + b"9" * 20 + b" 1 1 1 1 1",
    ):
        assert parse_report(bad) is None


def test_the_board_keeps_the_last_state_and_recent_misses() -> None:
    board = MirrorBoard("127.0.0.1:22626")
    assert board.status() is None
    for i in range(MAX_RECENT_MISSING + 4):
        board.missing(f"sha256:{i:064x}")
    assert board.reported(MirrorReport(True, 1, 0, 5, 10, 2, 0), "2026-11-28T00:00:00+00:00")
    assert not board.reported(MirrorReport(True, 1, 0, 5, 10, 2, 0), "later")
    status = board.status()
    assert status is not None and status.serving and status.listen == "127.0.0.1:22626"
    assert len(status.recent_missing) == MAX_RECENT_MISSING
    assert status.recent_missing[0] == f"sha256:{MAX_RECENT_MISSING + 3:064x}"
    assert status.to_json()["registryBlobs"] == 0
