"""Untrusted input, parsed strictly and within bounds; untrusted text, made safe to show.

Every file, answer and header nodeagent reads may come from someone it should not trust
(a bundle on a stick, a registry, an edited spec). Parsers here never crash on such input
and never take more than linear time: each either returns plain values (dict, list, str,
int, float, bool, None) or raises ``MalformedInput`` with a short, clipped message that the
caller wraps in its own error type (and reason code).

- ``loads_json``: RFC 8259 only. UTF-8 (no BOM, no UTF-16), no NaN or Infinity, no
  duplicate keys, no lone surrogates, bounded size, nesting depth and integer length.
- ``load_yaml``: YAML as Kubernetes reads it: timestamps stay strings, explicit tags must
  fit their values, bounded size, nesting depth and alias expansion (an alias "bomb" is
  refused before anything is expanded), no lone surrogates.
- ``loads_toml``: TOML with bounded size and nesting, no NaN or infinity, no integer
  longer than Python reads.
- ``clip``: text for a message, the journal or a terminal: control characters and lone
  surrogates escaped, at most ``limit`` characters.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections.abc import Iterable, Iterator
from typing import Any, Final

DEFAULT_MAX_DEPTH: Final = 64
"""Nesting of arrays and objects; real specs, manifests and answers stay below 10."""
MAX_INT_DIGITS: Final = 40
"""Longer integers are refused before Python converts them (its own limit is 4300 digits)."""
DEFAULT_MAX_NODES: Final = 1_000_000
"""YAML: values after alias expansion. A 490-byte alias bomb expands to ~10^9."""
CLIP_CHARS: Final = 300

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_UNSAFE_CHARS = re.compile(
    r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


class MalformedInput(ValueError):
    """Input refused by a strict parser; the message is clipped and safe to show."""


# ---------------------------------------------------------------- text for humans
def clip(text: object, limit: int = CLIP_CHARS) -> str:
    """``text`` safe for a message, the journal or a terminal, at most ~``limit`` characters.

    Control characters (escape sequences), bidi overrides and lone surrogates become
    ``\\xNN``/``\\uNNNN``; longer text is cut and says how much was left out.
    """
    raw = text if isinstance(text, str) else str(text)
    head = raw[:limit]
    shown = _UNSAFE_CHARS.sub(_escape_char, head)
    if len(shown) > limit:
        shown = shown[:limit]
    if len(raw) > limit:
        shown += f"…({len(raw) - limit} more characters)"
    return shown


def quoted(text: object, limit: int = CLIP_CHARS) -> str:
    """``clip(text)`` in single quotes, for naming a value inside a message. Unlike ``repr``
    of a clipped text, non-ASCII characters stay as they are (``repr`` writes a
    ten-character escape for each, and undoes the clipping's bound)."""
    return f"'{clip(text, limit)}'"


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _decode(data: bytes | str, what: str, max_bytes: int) -> str:
    size = len(data)
    if size > max_bytes:
        raise MalformedInput(f"{what} is {size} bytes, more than the {max_bytes} allowed")
    if isinstance(data, str):
        text = data
    else:
        if data.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
            raise MalformedInput(f"{what} is not UTF-8 text (a byte-order mark: UTF-16?)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedInput(
                f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}"
            ) from None
    if "\x00" in text:
        raise MalformedInput(f"{what} is not UTF-8 text (NUL characters: UTF-16?)")
    if _LONE_SURROGATE.search(text):
        raise MalformedInput(f"{what} contains a lone surrogate; it is not valid Unicode")
    return text


# ---------------------------------------------------------------- JSON
def loads_json(
    data: bytes | str,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Any:
    """Strict JSON (see the module docstring) or ``MalformedInput``."""
    text = _decode(data, what, max_bytes)
    # The C decoder is linear and refuses nesting beyond the interpreter's recursion limit
    # (RecursionError, below); the depth bound is checked on what it returns. A regex
    # pre-scan that skipped strings was quadratic on an unterminated string of escaped
    # quotes (40 KB of "\"...: 25 s of CPU).
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
    except MalformedInput as exc:
        raise MalformedInput(f"{what}: {exc}") from None
    except RecursionError:  # deeper than the interpreter allows: count the brackets instead
        depth = _bracket_depth(text)
        raise MalformedInput(f"{what} is nested {depth} deep, more than {max_depth}") from None
    except ValueError as exc:
        raise MalformedInput(f"{what} is not valid JSON: {clip(exc, 120)}") from None
    depth = _container_depth(value)
    if depth > max_depth:
        raise MalformedInput(f"{what} is nested {depth} deep, more than {max_depth}")
    _check_strings(value, what)
    return value


def _container_depth(value: Any) -> int:
    """Nesting of arrays and objects in a decoded value, as brackets count it (``[]`` is 1)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _bracket_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in ``text``, strings not skipped (one linear pass; only
    for a document too deep to decode, whose count is then an upper bound)."""
    brackets = _NOT_BRACKET.sub("", text)
    steps = (1 if c in "[{" else -1 for c in brackets)
    return max(itertools.accumulate(steps, initial=0))


_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise MalformedInput(f"duplicate key {quoted(key, 80)}")
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise MalformedInput(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise MalformedInput(f"an integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > 2 * MAX_INT_DIGITS:
        raise MalformedInput(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise MalformedInput(f"{clip(text, 40)} is out of range")
    return value


def _check_strings(value: Any, what: str) -> None:
    """Escaped lone surrogates (``"\\ud800"``) decode to invalid text: refuse them."""
    for text in _strings(value):
        if _LONE_SURROGATE.search(text):
            raise MalformedInput(f"{what} contains an escaped lone surrogate (not valid Unicode)")


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# ---------------------------------------------------------------- TOML
def loads_toml(
    data: bytes | str, *, what: str, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """TOML within bounds, or ``MalformedInput``."""
    text = _decode(data, what, max_bytes)
    try:
        doc = tomllib.loads(text, parse_float=_toml_float)
    except MalformedInput as exc:
        raise MalformedInput(f"{what}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise MalformedInput(f"{what} is not valid TOML: {clip(exc, 160)}") from None
    except ValueError as exc:  # int() of more digits than Python converts
        raise MalformedInput(f"{what} holds a number too long to read: {clip(exc, 80)}") from None
    except RecursionError:
        raise MalformedInput(f"{what} is nested deeper than TOML parsing allows") from None
    if _depth(doc, max_depth) > max_depth:
        raise MalformedInput(f"{what} is nested more than {max_depth} deep")
    return doc


def _toml_float(text: str) -> float:
    """A TOML float; ``inf`` and ``nan`` are TOML's own, but a literal that overflows is refused."""
    if len(text) > 2 * MAX_INT_DIGITS:
        raise MalformedInput(f"a number of {len(text)} characters")
    value = float(text)
    if math.isinf(value) and "inf" not in text:
        raise MalformedInput(f"{clip(text, 40)} is out of range")
    return value


def _depth(value: Any, limit: int) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children: Iterable[Any] = ()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        stack.extend((child, level + 1) for child in children)
    return deepest


# ---------------------------------------------------------------- YAML
def load_yaml(
    data: bytes | str,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> list[Any]:
    """Every document of a YAML stream as plain values, or ``MalformedInput``."""
    from nodeagent.strict import yaml_loader  # noqa: PLC0415  (PyYAML: by the first YAML read)

    text = _decode(data, what, max_bytes)
    return yaml_loader.load_documents(text, what=what, max_depth=max_depth, max_nodes=max_nodes)
