"""Unit tests of the registry transport's bounds on an answer's header fields."""

from __future__ import annotations

import pytest

from nodeagent.adapters.registry.transport import (
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    MAX_URL_CHARS,
    MalformedResponse,
    check_content_length,
    checked_headers,
    is_http_url,
    origin,
    realm_takes_credentials,
    redirect_url,
)
from nodeagent.errors import RegistryUnavailable


def test_header_names_are_lowered_and_repeated_fields_joined() -> None:
    fields = [
        ("Content-Type", "application/json"),
        ("WWW-Authenticate", 'Basic realm="r"'),
        ("www-authenticate", 'Bearer realm="https://a/t"'),
        ("Content-Length", "12"),
        ("content-length", "12"),
    ]
    assert checked_headers(fields) == {
        "content-type": "application/json",
        "www-authenticate": 'Basic realm="r", Bearer realm="https://a/t"',
        "content-length": "12",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([("X", "1")] * (MAX_HEADER_COUNT + 1), "header fields, more than"),
        ([("X", "a" * 50_000), ("Y", "b" * 50_000)], "more than"),
        ([("Content-Length", "1"), ("Content-Length", "2")], "two different Content-Length"),
    ],
)
def test_answers_outside_the_bounds_are_malformed(
    fields: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(MalformedResponse, match=message):
        checked_headers(fields)


def test_one_challenge_just_under_the_header_bound_passes_the_transport() -> None:
    value = "Bearer " + "a" * 60_000  # issue 13's drill: refused by the challenge parser
    assert len(value) < MAX_HEADER_BYTES
    assert checked_headers([("WWW-Authenticate", value)])["www-authenticate"] == value


@pytest.mark.parametrize("value", ["0", "1024", " 1024 "])
def test_content_length_within_the_bound(value: str) -> None:
    check_content_length({"content-length": value}, 1024)
    check_content_length({}, 1024)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1025", "more than the 1024 allowed"),
        ("-1", "not a byte count"),
        ("+5", "not a byte count"),
        ("1_000", "not a byte count"),
        ("9" * 400, "not a byte count"),  # issue 13's 400-digit integer
        ("0x10", "not a byte count"),
        ("\x1b[2J", "not a byte count"),
    ],
)
def test_content_length_out_of_range_is_malformed(value: str, message: str) -> None:
    with pytest.raises(MalformedResponse, match=message) as caught:
        check_content_length({"content-length": value}, 1024)
    assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://auth.example.com/token?x=1", True),
        ("http://127.0.0.1:5000/t", True),
        ("https://" + "a" * MAX_URL_CHARS, False),
        ("file:///etc/passwd", False),
        ("https:///path-without-host", False),
        ("/relative", False),
        ("http://x/t\r\nX-Evil: 1", False),
        ("http://x/a b", False),
        ("http://[::1/t", False),  # urlsplit's ValueError
        ("http://x/caf\u00e9", False),
        ("", False),
    ],
)
def test_is_http_url(url: str, expected: bool) -> None:
    assert is_http_url(url) is expected


def test_redirects_resolve_against_the_request() -> None:
    base = "https://reg.local/v2/app/blobs/sha256:0"
    assert redirect_url("ref", base, "/other") == "https://reg.local/other"
    assert redirect_url("ref", base, "http://cdn.local/b?sig=1") == "http://cdn.local/b?sig=1"
    assert origin("https://Reg.Local:443/x") != origin("http://reg.local:443/x")


@pytest.mark.parametrize(
    "location", ["file:///etc/passwd", "ftp://x/", "//[::1", "x" * (MAX_URL_CHARS + 1), "a\x1b[2J"]
)
def test_redirects_nodeagent_does_not_follow(location: str) -> None:
    with pytest.raises(RegistryUnavailable, match="redirected to") as caught:
        redirect_url("ref", "https://reg.local/v2/x", location)
    assert len(str(caught.value)) < 400
    assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize(
    ("realm", "registry", "takes"),
    [
        # https realms on any host: Docker Hub, GitLab, Quay.
        ("https://auth.docker.io/token", "https://registry-1.docker.io", True),
        ("https://gitlab.com/jwt/auth", "https://registry.gitlab.com", True),
        ("https://auth.example:8443/t", "http://reg.example:5000", True),
        # plain http: only for a plain-http (insecure) registry, on its own host name.
        ("http://reg.example:5001/token", "http://reg.example:5000", True),
        ("http://REG.example/token", "http://reg.example:5000", True),
        ("http://127.0.0.1:5001/token", "http://127.0.0.1:5000", True),
        ("http://evil.example/token", "http://reg.example:5000", False),
        ("http://127.0.0.2:5001/token", "http://127.0.0.1:5000", False),
        ("http://reg.example/token", "https://reg.example", False),  # a downgrade
        ("http://auth.docker.io/token", "https://registry-1.docker.io", False),
        ("http://reg.example.evil/token", "http://reg.example", False),
        ("http://reg.example@evil.example/t", "http://reg.example", False),
        # anything else is never given credentials.
        ("ftp://reg.example/token", "http://reg.example", False),
        ("http://[::1/token", "http://[::1]:5000", False),
        ("", "http://reg.example", False),
    ],
)
def test_credentials_go_to_https_realms_or_to_an_insecure_registrys_own_host(
    realm: str, registry: str, takes: bool
) -> None:
    assert realm_takes_credentials(realm, registry) is takes
