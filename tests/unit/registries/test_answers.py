"""Unit tests of nodeagent.registries.answers: token answers and the challenge to answer.

Crash inputs of issue 13 kept as regression cases: a token answer with a huge
``expires_in`` or deep nesting ended the sync task with an unhandled exception.
"""

from __future__ import annotations

import json

import pytest

from nodeagent.errors import RegistryError
from nodeagent.registries import (
    DEFAULT_TOKEN_LIFETIME_S,
    TokenAnswer,
    parse_token_answer,
    pick_challenge,
)
from nodeagent.registries.answers import (
    MAX_TOKEN_ANSWER_BYTES,
    MAX_TOKEN_CHARS,
    MAX_TOKEN_LIFETIME_S,
)

REF = "127.0.0.1:5000/app@sha256:" + "ab" * 32
SECRET = "s3cr3t-t0ken"


def _answer(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (_answer(token=SECRET), TokenAnswer(SECRET, DEFAULT_TOKEN_LIFETIME_S)),
        (_answer(access_token=SECRET, expires_in=300), TokenAnswer(SECRET, 300)),
        (_answer(token=SECRET, access_token="other"), TokenAnswer(SECRET, 60)),
        (_answer(token="", access_token=SECRET), TokenAnswer(SECRET, 60)),
        (_answer(token=SECRET, expires_in=None), TokenAnswer(SECRET, 60)),
        (_answer(token=SECRET, expires_in=0), TokenAnswer(SECRET, 60)),  # at least 60 s
        (_answer(token=SECRET, expires_in=-5), TokenAnswer(SECRET, 60)),
        (_answer(token=SECRET, expires_in=10**30), TokenAnswer(SECRET, MAX_TOKEN_LIFETIME_S)),
        (
            _answer(token=SECRET, expires_in=900, issued_at="2024-01-01T00:00:00Z"),
            TokenAnswer(SECRET, 900),
        ),
        (_answer(token=SECRET, refresh_token="x", extra={"a": [1, 2]}), TokenAnswer(SECRET, 60)),
    ],
)
def test_token_answers(body: bytes, expected: TokenAnswer) -> None:
    assert parse_token_answer(body, ref=REF) == expected


BAD_ANSWERS = {
    "not JSON": b"<html>503</html>",
    "empty": b"",
    "a list": b"[]",
    "no token": _answer(expires_in=60),
    "a number as token": _answer(token=5),
    "a token with a newline (header injection)": _answer(token=SECRET + "\r\nX-Evil: 1"),
    "a token with a space": _answer(token="a b"),
    "a non-ASCII token": _answer(token="t\u00f6ken"),
    "a token too long": _answer(token="a" * (MAX_TOKEN_CHARS + 1)),
    "expires_in as a string": _answer(token=SECRET, expires_in="300"),
    "expires_in as a float": _answer(token=SECRET, expires_in=300.5),
    "expires_in as a boolean": _answer(token=SECRET, expires_in=True),
    "expires_in with 400 digits (issue 13)": b'{"token":"t","expires_in":' + b"9" * 400 + b"}",
    "expires_in 1e308": b'{"token":"t","expires_in":1e999}',
    "NaN": b'{"token":"t","expires_in":NaN}',
    "duplicate keys": b'{"token":"t","token":"u"}',
    "nested 1000 deep (issue 13)": b'{"token":"t","x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    "too large": b'{"token":"t","pad":"' + b"x" * MAX_TOKEN_ANSWER_BYTES + b'"}',
    "issued_at a number": _answer(token=SECRET, issued_at=5),
    "not UTF-8": b'{"token":"\xff"}',
    "a lone surrogate": b'{"token":"t","x":"\\ud800"}',
}


@pytest.mark.parametrize("name", sorted(BAD_ANSWERS))
def test_bad_token_answers_are_a_registry_error_without_the_token(name: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_token_answer(BAD_ANSWERS[name], ref=REF)
    message = str(caught.value)
    assert message.startswith(f"RegistryError: {REF}")
    assert SECRET not in message
    assert len(message) < 600
    assert caught.value.__cause__ is None


def test_a_token_answer_repr_hides_the_token() -> None:
    assert SECRET not in repr(TokenAnswer(SECRET, 60))


@pytest.mark.parametrize(
    ("header", "scheme"),
    [
        ('Basic realm="r", Bearer realm="https://a/t"', "bearer"),
        ('Negotiate abc, Basic realm="r"', "basic"),
        ("Negotiate abc", "negotiate"),
        ("", ""),
    ],
)
def test_pick_challenge_prefers_bearer_then_basic(header: str, scheme: str) -> None:
    assert pick_challenge(header, ref=REF, host="h").scheme == scheme


@pytest.mark.parametrize(
    "header",
    ["Bearer " + "a" * 60_000, 'Bearer realm="x', 'Bearer realm="\x1b[31m"', "=x"],
)
def test_a_challenge_nodeagent_cannot_read_is_a_registry_error(header: str) -> None:
    """Transient: a broken answer is retried within a minute, not left until the resync."""
    with pytest.raises(RegistryError, match="cannot read") as caught:
        pick_challenge(header, ref=REF, host="reg.local")
    assert "\x1b" not in str(caught.value)
    assert len(str(caught.value)) < 600
