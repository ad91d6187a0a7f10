"""A registry's HTTP answers as the error tree and as credentials to send (pure, no I/O).

- ``pick_challenge``: the challenge to answer among a ``WWW-Authenticate`` value's
  (``nodeagent.strict.http.parse_challenges``, linear time, at most 16 KiB): ``Bearer``
  first, then ``Basic``; a value nodeagent cannot read is ``RegistryError`` (the registry
  is up but its answer breaks the protocol: retried within a minute, like a 5xx, rather
  than left until the resync as a refusal of the credentials would be).
- ``basic_authorization`` answers a basic challenge.
- ``parse_token_answer`` reads a token server's answer (distribution's token
  specification): strict JSON of at most ``MAX_TOKEN_ANSWER_BYTES`` nested at most
  ``MAX_TOKEN_ANSWER_DEPTH`` deep; ``token`` (else ``access_token``) a string of at most
  ``MAX_TOKEN_CHARS`` visible ASCII characters (it goes into a header as it is);
  ``expires_in`` an integer, missing or null meaning ``DEFAULT_TOKEN_LIFETIME_S``, and
  cut into ``MIN_TOKEN_LIFETIME_S``..``MAX_TOKEN_LIFETIME_S`` (containers-image raises a
  shorter one to 60 s too); ``issued_at`` a string when given (not used: the lifetime
  counts from receipt, on nodeagent's own clock). Anything else is ``RegistryError``
  (the registry is up but its answer is broken; retried later); no message ever holds
  the token.
- ``status_error`` maps an HTTP status to the error tree, with ``Retry-After`` read by
  ``nodeagent.strict.http.parse_retry_after`` (at most an hour).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import (
    ImageNotFound,
    NodeAgentError,
    RegistryAuthFailed,
    RegistryError,
    RegistryUnavailable,
)
from nodeagent.ports import RegistryCredentials
from nodeagent.strict import MalformedInput, clip, loads_json
from nodeagent.strict.http import Challenge, parse_challenges, parse_retry_after

MAX_TOKEN_ANSWER_BYTES: Final = 256 * 1024
"""A larger token answer is refused; real ones are a few KiB."""
MAX_TOKEN_ANSWER_DEPTH: Final = 8
"""A token answer is one flat object; a little nesting in fields nodeagent ignores is fine."""
MAX_TOKEN_CHARS: Final = 16 * 1024
"""A longer token is refused: servers commonly refuse request headers beyond 8-16 KiB."""
DEFAULT_TOKEN_LIFETIME_S: Final = 60
"""A token answer without ``expires_in`` is valid this long (distribution's token spec)."""
MIN_TOKEN_LIFETIME_S: Final = 60
"""A shorter ``expires_in`` counts as this (the spec says a token lives at least 60 s)."""
MAX_TOKEN_LIFETIME_S: Final = 86_400
"""A longer ``expires_in`` counts as this: a day; a token is fetched again after it."""
_TOKEN_TEXT: Final = re.compile(r"[\x21-\x7e]+")
_MAX_ISSUED_AT_CHARS: Final = 64


@dataclass(frozen=True, slots=True)
class TokenAnswer:
    """A token and how long it may be used."""

    token: str
    lifetime_s: int

    def __repr__(self) -> str:  # never the secret
        return f"TokenAnswer(token=<{len(self.token)} characters>, lifetime_s={self.lifetime_s})"


def pick_challenge(header: str, *, ref: str, host: str) -> Challenge:
    """The ``Bearer`` challenge of ``header``, else the ``Basic`` one, else the first one
    (``Challenge("")`` for none); ``RegistryError`` when the header is malformed."""
    try:
        challenges = parse_challenges(header)
    except MalformedInput as err:
        raise RegistryError(
            f"{clip(ref)}: registry {clip(host, 80)} asks for authentication nodeagent cannot "
            f"read ({err}); retrying later"
        ) from None
    for scheme in ("bearer", "basic"):
        for challenge in challenges:
            if challenge.scheme == scheme:
                return challenge
    return challenges[0] if challenges else Challenge("")


def basic_authorization(credentials: RegistryCredentials) -> str | None:
    """The ``Authorization`` value for HTTP basic auth, or None without a user name."""
    if credentials.username:
        pair = f"{credentials.username}:{credentials.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    if credentials.auth:
        return f"Basic {credentials.auth}"
    return None


def parse_token_answer(body: bytes, *, ref: str) -> TokenAnswer:
    """The token of a token server's answer (see the module docstring), or ``RegistryError``."""
    try:
        doc = loads_json(body, what="the token server's answer", max_bytes=MAX_TOKEN_ANSWER_BYTES,
                         max_depth=MAX_TOKEN_ANSWER_DEPTH)  # fmt: skip
        return _token_answer(doc)
    except MalformedInput as err:
        raise RegistryError(f"{clip(ref)}: {err}; retrying later") from None


def _token_answer(doc: Any) -> TokenAnswer:
    if not isinstance(doc, dict):
        raise MalformedInput("the token server's answer is not a JSON object")
    token = _token_field(doc, "token") or _token_field(doc, "access_token")
    if not token:
        raise MalformedInput("the token server's answer holds no token")
    issued_at = doc.get("issued_at")
    if issued_at is not None and (
        not isinstance(issued_at, str) or len(issued_at) > _MAX_ISSUED_AT_CHARS
    ):
        raise MalformedInput("the token server's 'issued_at' is not a short date string")
    return TokenAnswer(token, _lifetime_s(doc.get("expires_in")))


def _token_field(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedInput(f"the token server's {key!r} is not a string")
    if len(value) > MAX_TOKEN_CHARS:
        raise MalformedInput(
            f"the token server's {key!r} is {len(value)} characters, more than {MAX_TOKEN_CHARS}"
        )
    if value and not _TOKEN_TEXT.fullmatch(value):
        raise MalformedInput(
            f"the token server's {key!r} holds characters a header cannot carry "
            "(white space, control or non-ASCII characters)"
        )
    return value


def _lifetime_s(value: Any) -> int:
    if value is None:
        return DEFAULT_TOKEN_LIFETIME_S
    if type(value) is not int:
        raise MalformedInput(
            f"the token server's 'expires_in' is {clip(repr(value), 40)}, not an integer"
        )
    return min(max(value, MIN_TOKEN_LIFETIME_S), MAX_TOKEN_LIFETIME_S)


def retry_after_s(headers: Mapping[str, str], *, now_s: float) -> float | None:
    """``Retry-After`` (lower-case key) in seconds from ``now_s`` (Unix time), at most an
    hour; None when absent or unreadable."""
    value = headers.get("retry-after")
    return None if value is None else parse_retry_after(value, now_s=now_s)


def status_error(
    status: int, headers: Mapping[str, str], *, ref: str, what: str, now_s: float
) -> NodeAgentError | None:
    """The error for a registry's answer to a GET of ``what``; None for 200.

    ``now_s`` (Unix time) turns a ``Retry-After`` date into a delay."""
    if status == 200:
        return None
    ref = clip(ref)
    if status in (401, 403):
        return RegistryAuthFailed(
            f"{ref}: the registry refused access to the {what} (HTTP {status}); "
            "check the pull secret's credentials for this registry"
        )
    if status == 404:
        return ImageNotFound(f"{ref}: the registry has no such {what} (HTTP 404)")
    delay_s = retry_after_s(headers, now_s=now_s)
    if 500 <= status <= 599:
        return RegistryError(
            f"{ref}: the registry failed to serve the {what} (HTTP {status}); retrying later",
            retry_after_s=delay_s,
        )
    return RegistryUnavailable(
        f"{ref}: the registry answered HTTP {status} for the {what}; retrying later",
        retry_after_s=delay_s,
    )
