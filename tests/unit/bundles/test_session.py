"""The session process's spec and reports (``nodeagent.bundles.session``): what each side
accepts, round trips, and what is refused."""

from __future__ import annotations

import json

import pytest

from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.bundles.session import (
    MAX_REPORT_BYTES,
    SessionReport,
    SessionSpec,
    parse_report,
    parse_spec,
    render_report,
    render_spec,
)
from nodeagent.strict import MalformedInput

HEX = "ab" * 32
DIGEST = f"sha256:{HEX}"
REASONS = frozenset({"BundleDigestMismatch", "BundleSizeMismatch"})


def spec_line(**changes: object) -> bytes:
    body: dict[str, object] = {
        "version": 1, "root": "/var/lib/nodeagent/store", "port": 0,
        "files": {DIGEST: [f"blobs/sha256/{HEX}", 10, HEX]}, "tags": {"app/v1": DIGEST},
    }  # fmt: skip
    body.update(changes)
    return json.dumps(body).encode() + b"\n"


def test_a_spec_round_trips() -> None:
    spec = SessionSpec("/store", {DIGEST: ExpectedFile("blobs/x", 3, HEX)}, {"r/t": DIGEST}, 0)
    assert parse_spec(render_spec(spec)) == spec
    awaiting = SessionSpec("/store", spec.files, spec.tags, 0, arrival_wait_s=1800)
    assert parse_spec(render_spec(awaiting)) == awaiting


def test_a_spec_without_an_arrival_wait_awaits_nothing() -> None:
    """The key is optional (a daemon of before decision 0079 sends none)."""
    assert b"arrival_wait_s" not in render_spec(SessionSpec("/store", {}, {}))
    assert parse_spec(spec_line()).arrival_wait_s == 0
    assert parse_spec(spec_line(arrival_wait_s=3600)).arrival_wait_s == 3600


@pytest.mark.parametrize(
    "changes",
    [
        {"version": 2},
        {"root": "relative/store"},
        {"port": 70000},
        {"port": True},
        {"extra": 1},
        {"files": {"md5:00": ["blobs/x", 1, HEX]}},
        {"files": {DIGEST: ["../../etc/shadow", 1, HEX]}},
        {"files": {DIGEST: ["/etc/shadow", 1, HEX]}},
        {"files": {DIGEST: ["blobs/x", -1, HEX]}},
        {"files": {DIGEST: ["blobs/x", 1, "zz"]}},
        {"files": {DIGEST: ["blobs/x", 1]}},
        {"tags": {"r/t": f"sha256:{'cd' * 32}"}},  # a tag for a digest it does not serve
        {"tags": {"": DIGEST}},
        {"arrival_wait_s": 3601},
        {"arrival_wait_s": -1},
        {"arrival_wait_s": 1.5},
        {"arrival_wait_s": True},
        {"arrival_wait_s": "60"},
    ],
)
def test_a_spec_breaking_a_rule_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(MalformedInput):
        parse_spec(spec_line(**changes))


@pytest.mark.parametrize(
    "report",
    [
        SessionReport("listening", port=4242, pid=17, uid=990),
        SessionReport("counters", requests=3, bytes_served=1 << 40),
        SessionReport("rejected", digest=DIGEST, reason="BundleDigestMismatch", message="bad"),
        SessionReport("closed", requests=4, bytes_served=5),
    ],
)
def test_each_report_round_trips(report: SessionReport) -> None:
    assert parse_report(render_report(report), REASONS) == report


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[]\n",
        b'{"event":"exploded"}\n',
        b'{"event":"listening","port":0,"pid":1,"uid":0}\n',
        b'{"event":"listening","port":1,"pid":1}\n',
        b'{"event":"counters","requests":-1,"bytes_served":0}\n',
        b'{"event":"counters","requests":1.5,"bytes_served":0}\n',
        b'{"event":"counters","requests":1,"bytes_served":0,"more":1}\n',
        b'{"event":"rejected","digest":"' + DIGEST.encode() + b'","reason":"StoreFull",'
        b'"message":"x"}\n',
        b'{"event":"rejected","digest":"sha256:../x","reason":"BundleSizeMismatch",'
        b'"message":"x"}\n',
        b'{"event":"counters","requests":1,"requests":2,"bytes_served":0}\n',
        b'{"event":"closed","requests":1,"bytes_served":' + b"9" * (MAX_REPORT_BYTES) + b"}\n",
    ],
)
def test_a_report_breaking_a_rule_is_refused(line: bytes) -> None:
    with pytest.raises(MalformedInput):
        parse_report(line, REASONS)


def test_a_rejections_message_is_clipped_and_escaped() -> None:
    line = json.dumps({
        "event": "rejected", "digest": DIGEST, "reason": "BundleSizeMismatch",
        "message": "\x1b]0;owned\x07" + "y" * 1200,
    }).encode()  # fmt: skip
    parsed = parse_report(line, REASONS)
    assert "\x1b" not in parsed.message and "\x07" not in parsed.message
    assert len(parsed.message) < 600  # 500 characters, escaped, and how many more there were
