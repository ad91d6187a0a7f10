"""HTTP header values a registry sends, parsed in linear time (pure, no I/O).

- ``parse_challenges``: a ``WWW-Authenticate`` value (RFC 9110, section 11.6.1) as a
  tuple of ``Challenge``: one or more challenges separated by commas, each a scheme and
  either a token68 or ``name=value`` parameters (a token or a quoted string with
  ``\\`` escapes). Values longer than ``MAX_CHALLENGE_CHARS``, more than
  ``MAX_CHALLENGES`` challenges or ``MAX_PARAMS`` parameters in one, control characters,
  unterminated quoted strings, a parameter given twice in one challenge, or anything
  else outside the grammar raise ``MalformedInput`` with a clipped message. One
  leniency, because registries send it: an unquoted parameter value may hold any
  visible character but ``,`` and ``"`` (``realm=https://auth.example.com/token``).
- ``parse_retry_after``: a ``Retry-After`` value (RFC 9110, section 10.2.3): delta
  seconds or an HTTP-date (IMF-fixdate, and the obsolete RFC 850 and asctime forms a
  recipient must accept), as seconds from ``now_s``, between 0 and
  ``MAX_RETRY_AFTER_S``; anything else is ``None`` (the caller keeps its own delay).
- ``parse_request_head``: the head of a request a scraper sends to the metrics endpoint
  (RFC 9112, sections 2-5): the request line and header fields as a ``RequestHead``, at
  most ``MAX_HEAD_BYTES`` and ``MAX_HEADER_FIELDS`` fields, ASCII, no obsolete line
  folding, no field name twice among the ones the endpoint reads; anything else raises
  ``MalformedInput`` (the endpoint answers 400).

Every step consumes characters from left to right; no pattern can backtrack over more
than the characters it matched, so a hostile 64 KiB value costs microseconds.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from nodeagent.strict import MalformedInput, clip, quoted

MAX_CHALLENGE_CHARS: Final = 16 * 1024
"""Longer ``WWW-Authenticate`` values are refused unparsed; real ones stay under 1 KiB."""
MAX_CHALLENGES: Final = 16
"""More challenges in one value are refused; registries send one or two."""
MAX_PARAMS: Final = 32
"""More parameters in one challenge are refused; a bearer challenge has four at most."""
MAX_RETRY_AFTER_S: Final = 3600
"""A longer wait asked for by a registry is cut to this (an hour; a resync comes sooner)."""
_MAX_RETRY_AFTER_CHARS: Final = 64

_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]++")
_TOKEN68: Final = re.compile(r"[A-Za-z0-9._~+/-]++=*+")
_SPACES: Final = re.compile(r"[ \t]*+")
_QUOTED: Final = re.compile(
    r'"((?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*+)"'
)
_BARE_VALUE: Final = re.compile(r"[\x21\x23-\x2b\x2d-\x7e\x80-\xff]++")  # not '"' nor ','
_QUOTED_PAIR: Final = re.compile(r"\\(.)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Challenge:
    """One challenge: ``scheme`` lower-case, ``params`` with lower-case names, or a token68."""

    scheme: str
    params: Mapping[str, str] = field(default_factory=dict)
    token68: str | None = None


class _Scanner:
    """A position in ``text``; every method moves it forward or leaves it."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        found = pattern.match(self.text, self.pos)
        if found is not None:
            self.pos = found.end()
        return found

    def skip_spaces(self) -> None:
        self.take(_SPACES)

    def skip_separators(self) -> bool:
        """Skip white space and commas; whether there was at least one comma."""
        had_comma = False
        while True:
            self.skip_spaces()
            if self.peek() != ",":
                return had_comma
            had_comma, self.pos = True, self.pos + 1

    def fail(self, what: str) -> MalformedInput:
        shown = clip(self.text[self.pos : self.pos + 40], 40)
        return MalformedInput(f"WWW-Authenticate: {what} at character {self.pos} (near {shown!r})")


def parse_challenges(value: str) -> tuple[Challenge, ...]:
    """Every challenge of a ``WWW-Authenticate`` value, in order (see the module docstring)."""
    if len(value) > MAX_CHALLENGE_CHARS:
        raise MalformedInput(
            f"WWW-Authenticate is {len(value)} characters, more than {MAX_CHALLENGE_CHARS}: "
            f"{clip(value, 80)}"
        )
    scanner = _Scanner(value)
    challenges: list[Challenge] = []
    scanner.skip_separators()
    while not scanner.at_end():
        if len(challenges) == MAX_CHALLENGES:
            raise scanner.fail(f"more than {MAX_CHALLENGES} challenges")
        challenges.append(_challenge(scanner))
        if not scanner.skip_separators() and not scanner.at_end():
            raise scanner.fail("expected ',' between challenges")
    return tuple(challenges)


def _challenge(scanner: _Scanner) -> Challenge:
    scheme = scanner.take(_TOKEN)
    if scheme is None:
        raise scanner.fail("expected an authentication scheme")
    name = scheme.group().lower()
    if scanner.at_end() or scanner.peek() == ",":
        return Challenge(name)
    if scanner.peek() not in " \t":
        raise scanner.fail("expected a space after the scheme")
    scanner.skip_spaces()
    if scanner.at_end() or scanner.peek() == ",":
        return Challenge(name)
    token68 = _token68(scanner)
    if token68 is not None:
        return Challenge(name, {}, token68)
    return Challenge(name, _params(scanner))


def _token68(scanner: _Scanner) -> str | None:
    """A token68 that ends the challenge; None (position kept) when parameters follow."""
    start = scanner.pos
    found = scanner.take(_TOKEN68)
    if found is not None:
        scanner.skip_spaces()
        if scanner.at_end() or scanner.peek() == ",":
            return found.group()
    scanner.pos = start
    return None


def _params(scanner: _Scanner) -> dict[str, str]:
    """``name=value`` pairs up to the end or to the next challenge's scheme."""
    params: dict[str, str] = {}
    before_comma = scanner.pos
    while not scanner.at_end():
        name = scanner.take(_TOKEN)
        if name is None:
            raise scanner.fail("expected a parameter name")
        scanner.skip_spaces()
        if scanner.peek() != "=":
            if not params:
                raise scanner.fail("expected '=' after the parameter name")
            scanner.pos = before_comma  # ``name`` was the scheme of the next challenge
            return params
        scanner.pos += 1
        scanner.skip_spaces()
        key = name.group().lower()
        if len(params) == MAX_PARAMS:
            raise scanner.fail(f"more than {MAX_PARAMS} parameters in one challenge")
        if key in params:
            raise scanner.fail(f"parameter {quoted(key, 40)} given twice")
        params[key] = _param_value(scanner)
        before_comma = scanner.pos
        if not scanner.skip_separators():
            if not scanner.at_end():
                raise scanner.fail("expected ',' after a parameter")
            return params
    return params


def _param_value(scanner: _Scanner) -> str:
    if scanner.peek() == '"':
        quoted = scanner.take(_QUOTED)
        if quoted is None:
            raise scanner.fail("unterminated or invalid quoted string")
        return _QUOTED_PAIR.sub(r"\1", quoted.group(1))
    bare = scanner.take(_BARE_VALUE)
    if bare is None:
        raise scanner.fail("expected a parameter value")
    return bare.group()


# ---------------------------------------------------------------- Retry-After
_MONTHS: Final = (
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
)  # fmt: skip
_DAY: Final = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_LONG_DAY: Final = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTH: Final = "(?P<month>" + "|".join(_MONTHS) + ")"
_TIME: Final = r"(?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)"
_HTTP_DATES: Final = (
    re.compile(rf"{_DAY}, (?P<day>\d\d) {_MONTH} (?P<year>\d{{4}}) {_TIME} GMT"),
    re.compile(rf"{_LONG_DAY}, (?P<day>\d\d)-{_MONTH}-(?P<year>\d\d) {_TIME} GMT"),
    re.compile(rf"{_DAY} {_MONTH} (?P<day>[ \d]\d) {_TIME} (?P<year>\d{{4}})"),
)
_DELTA_SECONDS: Final = re.compile(r"\d{1,10}")


def parse_retry_after(value: str, *, now_s: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value, ``now_s`` being the Unix time now."""
    text = value.strip(" \t")
    if not text or len(text) > _MAX_RETRY_AFTER_CHARS:
        return None
    if _DELTA_SECONDS.fullmatch(text):
        return float(min(int(text), MAX_RETRY_AFTER_S))
    when_s = _http_date_s(text, now_s)
    if when_s is None:
        return None
    return min(max(0.0, when_s - now_s), float(MAX_RETRY_AFTER_S))


def _http_date_s(text: str, now_s: float) -> float | None:
    for pattern in _HTTP_DATES:
        found = pattern.fullmatch(text)
        if found is not None:
            break
    else:
        return None
    year = int(found["year"])
    if year < 100:  # RFC 850: a two-digit year more than 50 years ahead is in the past
        this_year = int(now_s // 31_556_952) + 1970
        year += 100 * (this_year // 100)
        if year > this_year + 50:
            year -= 100
    fields = (int(found["day"]), int(found["hour"]), int(found["minute"]), int(found["second"]))
    day, hour, minute, second = fields
    if not (1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    month = _MONTHS.index(found["month"]) + 1
    if day > calendar.monthrange(year, month)[1]:
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


# ---------------------------------------------------------------- a request's head
MAX_HEAD_BYTES: Final = 8 * 1024
"""A longer request line and header block is refused (Prometheus sends about 300 bytes)."""
MAX_HEADER_FIELDS: Final = 64
"""More header fields in one request are refused."""
_REQUEST_LINE: Final = re.compile(
    r"(?P<method>[!#$%&'*+.^_`|~0-9A-Za-z-]{1,16}) (?P<target>[\x21-\x7e]{1,2048}) "
    r"HTTP/(?P<version>1\.[01])"
)
_FIELD: Final = re.compile(
    r"(?P<name>[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}):[ \t]*+(?P<value>[\x20-\x7e\t]*+)"
)
_SINGLE_FIELDS: Final = frozenset({"accept", "accept-encoding", "content-length", "host"})
"""Fields the endpoint reads or must not see twice (RFC 9112, section 6.3: two lengths)."""


@dataclass(frozen=True)
class RequestHead:
    """A request's method, target path (its query cut off) and the fields named in
    ``_SINGLE_FIELDS``, by lower-case name, their values without surrounding blanks."""

    method: str
    path: str
    version: str
    fields: Mapping[str, str] = field(default_factory=dict)


def parse_request_head(data: bytes) -> RequestHead:
    """``data``: everything up to and including the blank line that ends the head."""
    if len(data) > MAX_HEAD_BYTES:
        raise MalformedInput(f"a request head of {len(data)} bytes (at most {MAX_HEAD_BYTES})")
    if not data.endswith(b"\r\n\r\n"):
        raise MalformedInput("a request head that does not end with an empty line")
    try:
        text = data[:-4].decode("ascii")
    except UnicodeDecodeError as exc:
        raise MalformedInput(f"a request head with a non-ASCII byte at {exc.start}") from None
    lines = text.split("\r\n")
    request_line = _REQUEST_LINE.fullmatch(lines[0])
    if request_line is None:
        raise MalformedInput(f"not an HTTP/1 request line: {quoted(lines[0], 120)}")
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise MalformedInput(f"{len(lines) - 1} header fields (at most {MAX_HEADER_FIELDS})")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        found = _FIELD.fullmatch(line)
        if found is None:  # obsolete folding (a leading blank) and bare CR or LF end here
            raise MalformedInput(f"not a header field: {quoted(line, 120)}")
        name = found["name"].lower()
        if name not in _SINGLE_FIELDS:
            continue
        if name in fields:
            raise MalformedInput(f"the header field {quoted(name)} given twice")
        fields[name] = found["value"].rstrip(" \t")
    target = request_line["target"]
    path = target.split("?", 1)[0]
    return RequestHead(request_line["method"], path, request_line["version"], fields)
