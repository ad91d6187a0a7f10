"""Unit tests of the docker config JSON parser and its kubelet-style credential lookup."""

from __future__ import annotations

import base64
import json
import traceback

import pytest

from nodeagent.authfile import AuthStore, normalize_key, parse_auth_file
from nodeagent.errors import AuthFileInvalid, ImageReferenceInvalid

DIGEST = "sha256:" + "ab" * 32
SOURCE = "/var/lib/kubelet/config.json"


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _store(auths: dict[str, object]) -> AuthStore:
    return parse_auth_file(json.dumps({"auths": auths}), source=SOURCE)


# Each key's user name is its index in KEYS; the lookup must pick the right one.
KEYS = [
    "quay.io",
    "quay.io/team",
    "quay.io/team/app",
    "https://index.docker.io/v1/",
    "127.0.0.1:5000",
    "http://reg.example.com/",
    "*.example.org",
    "registry.example.com/ns/",
]
STORE = _store({key: {"auth": _auth(f"user{i}", "pw")} for i, key in enumerate(KEYS)})


@pytest.mark.parametrize(
    ("image", "expected_key"),
    [
        (f"quay.io/team/app@{DIGEST}", "quay.io/team/app"),
        ("quay.io/team/app:v1", "quay.io/team/app"),
        (f"quay.io/team/app2@{DIGEST}", "quay.io/team"),  # segments, not string prefixes
        ("quay.io/team/sub/x:tag", "quay.io/team"),
        ("quay.io/other/x", "quay.io"),
        ("QUAY.IO/team/app", "quay.io/team/app"),  # host names are case-insensitive
        ("nginx", "https://index.docker.io/v1/"),
        ("docker.io/library/nginx:1.25", "https://index.docker.io/v1/"),
        ("index.docker.io/x/y", "https://index.docker.io/v1/"),
        ("registry-1.docker.io/x/y", "https://index.docker.io/v1/"),
        (f"127.0.0.1:5000/x@{DIGEST}", "127.0.0.1:5000"),
        ("127.0.0.1:5001/x", None),  # the port is part of the registry
        ("127.0.0.1/x", None),
        ("reg.example.com/a/b", "http://reg.example.com/"),
        ("mirror.example.org/a", "*.example.org"),
        ("a.b.example.org/a", None),  # '*' stands for exactly one label
        ("registry.example.com/ns/app", "registry.example.com/ns/"),
        ("registry.example.com/nsx/app", None),
        ("ghcr.io/x/y", None),
    ],
)
def test_most_specific_key_wins(image: str, expected_key: str | None) -> None:
    found = STORE.credentials_for(image)
    expected = None if expected_key is None else f"user{KEYS.index(expected_key)}"
    assert (found.username if found else None) == expected


@pytest.mark.parametrize(
    ("keys", "image", "expected_key"),
    [
        (["https://index.docker.io/v1/", "docker.io"], "nginx", "docker.io"),
        (["docker.io", "https://index.docker.io/v1/"], "nginx", "docker.io"),
        (["*.example.org", "mirror.example.org"], "mirror.example.org/a", "mirror.example.org"),
        (["mirror.example.org", "*.example.org/a"], "mirror.example.org/a/b", "*.example.org/a"),
    ],
)
def test_ties_prefer_the_literal_key(keys: list[str], image: str, expected_key: str) -> None:
    store = _store({key: {"auth": _auth(f"user{i}", "pw")} for i, key in enumerate(keys)})
    found = store.credentials_for(image)
    assert found is not None
    assert found.username == f"user{keys.index(expected_key)}"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("quay.io", ("quay.io", ())),
        ("https://quay.io", ("quay.io", ())),
        ("http://quay.io/", ("quay.io", ())),
        ("https://index.docker.io/v1/", ("docker.io", ())),
        ("registry-1.docker.io", ("docker.io", ())),
        ("https://reg.example.com/v2/", ("reg.example.com", ())),
        ("Reg.Example.com:5000/ns/repo/", ("reg.example.com:5000", ("ns", "repo"))),
        ("https://reg.example.com/ns", ("reg.example.com", ("ns",))),
    ],
)
def test_keys_are_normalized(key: str, expected: tuple[str, tuple[str, ...]]) -> None:
    assert normalize_key(key) == expected


def test_credentials_carry_decoded_and_raw_auth() -> None:
    raw = _auth("alice", "p:a:ss")  # the password may contain colons
    found = _store({"quay.io": {"auth": raw}}).credentials_for("quay.io/a/b")
    assert found is not None
    assert (found.username, found.password, found.auth) == ("alice", "p:a:ss", raw)
    assert found.server_address == "quay.io"


def test_username_and_password_fields_are_used_without_auth() -> None:
    entry = {"username": "bob", "password": "pw", "identitytoken": "idt", "registrytoken": "rt"}
    found = _store({"https://reg.example.com/ns": entry}).credentials_for("reg.example.com/ns/a")
    assert found is not None
    assert (found.username, found.password, found.auth) == ("bob", "pw", "")
    assert (found.identity_token, found.registry_token) == ("idt", "rt")
    assert found.server_address == "reg.example.com/ns"


def test_auth_overrides_username_fields() -> None:
    entry = {"auth": _auth("from-auth", "pw1"), "username": "field", "password": "pw2"}
    found = _store({"quay.io": entry}).credentials_for("quay.io/a/b")
    assert found is not None
    assert (found.username, found.password) == ("from-auth", "pw1")


def test_entry_without_credentials_is_skipped() -> None:
    store = _store({"quay.io": {"email": "a@example.com"}, "quay.io/ns": {}})
    assert len(store) == 0
    assert store.credentials_for("quay.io/ns/app") is None


@pytest.mark.parametrize("text", ["", "  \n", "{}", '{"credsStore": "desktop"}'])
def test_files_without_auths_give_an_empty_store(text: str) -> None:
    store = parse_auth_file(text, source=SOURCE)
    assert len(store) == 0
    assert store.credentials_for("quay.io/a/b") is None


def test_empty_store_for_a_missing_file() -> None:
    store = AuthStore.empty(SOURCE)
    assert store.source == SOURCE
    assert store.credentials_for("nginx") is None


def test_lookup_of_an_invalid_image_name_raises() -> None:
    with pytest.raises(ImageReferenceInvalid):
        STORE.credentials_for("quay.io/UPPER/case")


SECRET = "hunter2-sekrit"
SECRET_B64 = base64.b64encode(SECRET.encode()).decode()  # no colon: not user:password


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"auths": {"quay.io": {"auth": "' + SECRET_B64 + '"}', "not valid JSON"),
        ("[1, 2]", "'auths' object"),
        ('{"auths": ["quay.io"]}', "'auths' object"),
        ('{"auths": {"quay.io": "' + SECRET + '"}}', "auths['quay.io'] must be an object"),
        ('{"auths": {"quay.io": {"auth": "' + SECRET_B64 + '"}}}', "base64 of 'username:password'"),
        ('{"auths": {"quay.io": {"auth": "' + SECRET + '!!"}}}', "not base64"),
        ('{"auths": {"quay.io": {"auth": "' + _auth(":" + SECRET, "") + '"}}}', "'username:"),
        ('{"auths": {"quay.io": {"auth": "/w=="}}}', "not base64 of UTF-8"),
        ('{"auths": {"quay.io": {"password": 12345}}}', "'password' must be a string"),
        ('{"auths": {"https://": {"auth": "' + _auth("a", SECRET) + '"}}}', "no registry host"),
        # issue 13: a non-ASCII auth value ended the daemon (b64decode's ValueError)
        ('{"auths": {"quay.io": {"auth": "' + SECRET + 'é=="}}}', "not base64"),
        ('{"auths": {"quay.io": {"auth": "☃"}}}', "not base64"),
        ('{"auths": {"quay.io": {"auth": "' + SECRET_B64[:-1] + '"}}}', "not base64"),
        ('{"auths": {"quay.io": {"auth": "' + _auth("a\n", SECRET) + '"}}}', "control characters"),
        ('{"auths": {"quay.io": {"registrytoken": "' + SECRET + '\\r\\nX: y"}}}', "white space"),
        ('{"auths": {"quay.io": {"identitytoken": "' + SECRET + 'é"}}}', "non-ASCII"),
        ('{"auths": {"quay.io": {"password": "' + SECRET * 2000 + '"}}}', "longer than 16384"),
        ('{"auths": {"quay.io": {"auth": "' + SECRET_B64 + '"}, "quay.io": {}}}', "duplicate key"),
        ('{"auths": {"quay.io": {"auth": NaN}}}', "NaN is not a JSON number"),
        ('{"auths": {"quay.io": {"password": "\\ud800' + SECRET + '"}}}', "lone surrogate"),
        ('{"x": ' + "[" * 600 + "]" * 600 + "}", "nested 601 deep"),
        (b'{"auths": {"quay.io": {"password": "\xff' + SECRET.encode() + b'"}}}', "not UTF-8"),
        (" " * (4 * 1024 * 1024 + 1) + "{}", "more than the 4194304 allowed"),
    ],
)
def test_bad_files_name_the_file_and_never_the_secret(text: str | bytes, message: str) -> None:
    with pytest.raises(AuthFileInvalid) as caught:
        parse_auth_file(text, source=SOURCE)
    error = caught.value
    assert SOURCE in str(error)
    assert message in str(error)
    assert error.reason == "AuthFileInvalid"
    printed = "".join(traceback.format_exception(error))
    for secret in (SECRET, SECRET_B64, "12345"):
        assert secret not in printed
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_repr_of_the_store_hides_secrets() -> None:
    store = _store({"quay.io": {"auth": _auth("alice", SECRET), "identitytoken": SECRET}})
    assert len(store) == 1
    assert SECRET not in repr(store)
    assert _auth("alice", SECRET) not in repr(store)
    assert "quay.io" in repr(store)


def test_one_bad_entry_refuses_the_whole_file_naming_the_entry() -> None:
    """A half-read file would silently give an image the credentials of a broader key."""
    auths: dict[str, object] = {
        "quay.io": {"auth": _auth("broad", "pw")},
        "quay.io/team": {"auth": "caf\u00e9"},
    }
    with pytest.raises(AuthFileInvalid, match=r"auths\['quay.io/team'\]: 'auth' is not base64"):
        _store(auths)


def test_a_long_key_is_clipped_in_the_message() -> None:
    key = "quay.io/" + "\x1b[2J" * 5000
    with pytest.raises(AuthFileInvalid) as caught:
        _store({key: {"auth": "not base64!"}})
    assert len(str(caught.value)) < 600
    assert "\x1b" not in str(caught.value)
