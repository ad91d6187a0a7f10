"""Fuzz: the registry-side files: the auth file (``authfile.parse_auth_file``) and
registries.conf with its drop-ins (``registries.insecure_registries``).

Contract: a value, or ``AuthFileInvalid`` / ``ConfigInvalid`` with a clipped message.
"""

from __future__ import annotations

import base64
import json

from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.authfile import AuthStore, normalize_key, parse_auth_file
from nodeagent.errors import AuthFileInvalid, ConfigInvalid
from nodeagent.registries import insecure_registries
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome

_AUTH = base64.b64encode(b"user:secret").decode()
auth_values = st.one_of(
    st.just(_AUTH), s.text, s.json_like,
    s.text.map(lambda t: base64.b64encode(s.utf8(t)).decode()),
)  # fmt: skip
auth_entries = st.fixed_dictionaries(
    {},
    optional={
        "auth": auth_values, "username": s.json_like, "password": s.json_like,
        "identitytoken": s.json_like, "registrytoken": s.json_like, "email": s.text,
    },
)  # fmt: skip
auth_keys = st.one_of(
    st.sampled_from(["quay.io", "https://index.docker.io/v1/", "*.example.com", "reg:5000/team"]),
    s.text,
)
auth_documents = st.one_of(
    st.dictionaries(auth_keys, st.one_of(auth_entries, s.json_like), max_size=4).map(
        lambda auths: {"auths": auths}
    ),
    s.json_like,
).map(json.dumps)


def _auth(text: str) -> None:
    result = outcome(
        "authfile.parse_auth_file",
        lambda: parse_auth_file(text, source="/run/secrets/auth.json"),
        allowed=(AuthFileInvalid,),
    )
    assert isinstance(result, AuthStore | AuthFileInvalid)


@given(st.one_of(s.text, s.raw_bytes.map(lambda b: b.decode("utf-8", "replace"))))
@example("1" * 4301)
@example("[" * 600 + "]" * 600)
@example('{"auths": {"quay.io": {"auth": 1e999}}}')
@example('{"auths": {"quay.io": {"auth": "' + "A" * 100_000 + '!"}}}')
def test_auth_file_raw(text: str) -> None:
    _auth(text)


@given(
    st.one_of(
        auth_documents,
        s.mutated(auth_documents.map(s.utf8)).map(lambda b: b.decode("utf-8", "replace")),
        s.deep("[", "]", st.integers(900, 100_000)),
    )
)
@example("[" * 100_000 + "]" * 100_000)
@example('{"auths": {"quay.io": {"auth": "dXNlcjpzZWNyZXQ=\u00e9"}}}')
@example('{"auths": {"' + "\x1b[2J" * 2000 + '": 1}}')
def test_auth_file_documents(text: str) -> None:
    _auth(text)


@given(auth_keys)
@example("https://" + "\x1b[2J" * 5000)
def test_auth_file_keys(key: str) -> None:
    """The host and path segments an ``auths`` key names (never pending)."""
    result = outcome("authfile.normalize_key", lambda: normalize_key(key), allowed=())
    assert isinstance(result, tuple)


toml_tables = st.one_of(
    st.builds(
        lambda location, prefix, insecure: (
            f'[[registry]]\nlocation = {location}\nprefix = {prefix}\ninsecure = {insecure}\n'
        ),
        st.sampled_from(['"quay.io"', '"reg.example.com/team"', '""', "1", "[]"]),
        st.sampled_from(['"quay.io"', '""', "{}"]),
        st.sampled_from(["true", "false", '"yes"', "1", "nan"]),
    ),
    st.just('[[registry]]\nlocation = "a"\n[[registry.mirror]]\nlocation = "m"\ninsecure = true\n'),
    st.just('[registries.insecure]\nregistries = ["a", "b"]\n'),
    st.just('[registries]\ninsecure = ["a"]\n'),
    st.just('registries = "x"\n'),
    st.just('unqualified-search-registries = ["docker.io"]\nregistry = 1\n'),
)  # fmt: skip
registries_texts = st.one_of(
    st.lists(toml_tables, max_size=4).map("".join),
    s.mutated(st.lists(toml_tables, max_size=4).map(lambda t: s.utf8("".join(t)))).map(
        lambda b: b.decode("utf-8", "replace")
    ),
)


def _registries(main: str, dropins: dict[str, str]) -> None:
    result = outcome(
        "registries.insecure_registries",
        lambda: insecure_registries(main, dropins),
        allowed=(ConfigInvalid,),
    )
    assert isinstance(result, frozenset | ConfigInvalid)


@given(s.text, st.dictionaries(s.words, s.text, max_size=2))
@example('[registries]\ninsecure = ["a"]\n', {})
@example("a = " + "[" * 600 + "]" * 600, {})
@example("a = " + "9" * 4301, {})
def test_registries_conf_raw(main: str, dropins: dict[str, str]) -> None:
    _registries(main, dropins)


@given(registries_texts, st.dictionaries(s.words, registries_texts, max_size=2))
def test_registries_conf_documents(main: str, dropins: dict[str, str]) -> None:
    _registries(main, dropins)
