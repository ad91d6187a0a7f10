"""Input strategies shared by the fuzz harnesses: raw bytes, hostile text, JSON-like
documents, mutations of valid documents, and size and depth bombs.

Structured strategies start from a valid document and break it a little (a value of the
wrong type, a key too many, bytes edited), so that inputs reach past the first check of a
parser; raw strategies cover everything else.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

ANY_CHAR = st.characters(codec=None, exclude_categories=())
"""Every code point, lone surrogates, controls and bidi overrides included."""
HOSTILE_CHARS = st.sampled_from(
    ["\x00", "\x1b[31m", "\n", "\r", "\t", "\x7f", "\x9b", "\u202e", "\u2028", "\ud800", "\udfff",
     "\ufeff", "é", "\u0130", "\\", '"', "'", "$", "{", "[", ":", "#", "&", "*", "!", "%", "@"]
)  # fmt: skip

short_text = st.text(ANY_CHAR, max_size=40)
"""Any text, short."""
words = st.lists(
    st.one_of(st.characters(min_codepoint=0x21, max_codepoint=0x7E), HOSTILE_CHARS), max_size=30
).map("".join)
"""Printable ASCII with hostile characters mixed in."""
long_text = st.builds(
    lambda piece, times: piece * times, st.text(ANY_CHAR, min_size=1, max_size=8),
    st.integers(200, 20_000),
)  # fmt: skip
"""Text of up to ~160,000 characters: longer than any message may echo."""
text = st.one_of(short_text, words, long_text)
raw_bytes = st.binary(max_size=2048)

big_numbers = st.sampled_from(
    [10**400, -(10**4000), 2**63, -(2**63) - 1, 1e308, -1e308, 5e-324, 0.1, 1.7976931348623157e308]
)  # fmt: skip
number_texts = st.sampled_from(
    ["1e308", "1e999", "-1e999", "NaN", "nan", "inf", "-Infinity", "Infinity", "0x10", "1_000",
     "9" * 400, "9" * 4301, "-0", "1.", ".5", "1e-400", "0o777", "+1", "00", "1" * 41]
)  # fmt: skip
"""Numbers as text that parsers have tripped on (issue 13): spelled out, not computed."""

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), big_numbers, text
)
json_like: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
    max_leaves=20,
)
"""Values a decoded document may hold where a parser expects something else."""


def deep(opening: str, closing: str, depth: st.SearchStrategy[int] | None = None) -> Any:
    """``opening * n + closing * n`` for n up to ~5,000 (recursion and depth bombs)."""
    depths = depth if depth is not None else st.integers(30, 5000)
    return st.builds(lambda n: opening * n + closing * n, depths)


@st.composite
def mutated(draw: st.DrawFn, seeds: st.SearchStrategy[bytes]) -> bytes:
    """A valid document edited a few times: bytes replaced, inserted, deleted, a slice
    repeated or cut off."""
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(0, 4))):
        size = len(data)
        at = draw(st.integers(0, size))
        edit = draw(st.sampled_from(["replace", "insert", "delete", "repeat", "truncate"]))
        if edit == "replace" and size:
            data[min(at, size - 1)] = draw(st.integers(0, 255))
        elif edit == "insert":
            data[at:at] = draw(st.one_of(st.binary(max_size=8), HOSTILE_CHARS.map(utf8)))
        elif edit == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif edit == "repeat":
            piece = bytes(data[at : at + draw(st.integers(1, 32))])
            data[at:at] = piece * draw(st.integers(1, 50))
        else:
            del data[at:]
    return bytes(data)


def utf8(text: str) -> bytes:
    """UTF-8, lone surrogates written as they are (invalid UTF-8, as a broken writer would)."""
    return text.encode("utf-8", "surrogatepass")


def json_bytes(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """``values`` as JSON text (NaN and lone surrogates written as Python writes them)."""
    return values.map(lambda v: json.dumps(v).encode())


def replaced(base: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with the item at ``path`` set to ``value`` (or added)."""
    copy: Any = json.loads(json.dumps(base))
    node = copy
    for step in path[:-1]:
        node = node[step]
    if isinstance(node, list) and isinstance(path[-1], int):
        node[path[-1] % len(node)] = value
    else:
        node[path[-1]] = value
    return dict(copy)


def edited_text(seeds: list[str]) -> st.SearchStrategy[str]:
    """One of ``seeds`` edited (``mutated``), as text (bad UTF-8 replaced)."""
    return mutated(st.sampled_from(seeds).map(utf8)).map(lambda b: b.decode("utf-8", "replace"))
