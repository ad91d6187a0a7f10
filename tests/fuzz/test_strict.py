"""Fuzz: the strict parsers of the kernel (nodeagent.strict) and ``clip``.

Contract: ``loads_json``, ``load_yaml`` and ``loads_toml`` return plain values or raise
``MalformedInput`` (clipped message), in linear time; ``clip`` never raises and returns
short, safe text; ``http.parse_request_head`` (what a scraper sends the metrics endpoint)
returns a head whose fields are the ones it reads, or ``MalformedInput``.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from nodeagent.strict import CLIP_CHARS, MalformedInput, clip, load_yaml, loads_json, loads_toml
from nodeagent.strict.http import MAX_HEAD_BYTES, RequestHead, parse_request_head
from tests.fuzz import strategies as s
from tests.fuzz.contract import check_text, outcome

_STRICT = (MalformedInput,)
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
"""~490 bytes that expand to 9**9 values (issue 13: 537 MiB inside an error message)."""


def _plain(value: Any, *, may_be_infinite: bool = False) -> None:
    """Only the types JSON, YAML and TOML decode to (TOML dates aside), numbers finite
    (``may_be_infinite``: TOML's own ``inf`` and ``nan``, written as such, are kept for the
    typed checks to refuse with the key's name; a literal that overflows is refused)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.items())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, float):
            assert math.isfinite(item) or may_be_infinite
        else:
            assert item is None or isinstance(item, str | int | bool) or hasattr(item, "isoformat")


def _json(data: bytes | str) -> None:
    result = outcome(
        "strict.loads_json", lambda: loads_json(data, what="fuzz", max_bytes=65536), allowed=_STRICT
    )
    if not isinstance(result, BaseException):
        _plain(result)


@given(s.raw_bytes)
@example(b'{"a": NaN}')
@example(b'{"a": 1, "a": 2}')
@example('{"a": 1}'.encode("utf-16"))
@example(b'"q\\ud800"')
@example(b"[" * 600 + b"]" * 600)
@example(b"9" * 4301)
def test_loads_json_raw(data: bytes) -> None:
    _json(data)


@given(st.one_of(s.mutated(s.json_bytes(s.json_like)), s.deep("[", "]"), s.deep('{"a":', "}")))
def test_loads_json_documents(data: bytes) -> None:
    _json(data)


def _yaml(data: bytes | str) -> None:
    result = outcome(
        "strict.load_yaml", lambda: load_yaml(data, what="fuzz", max_bytes=65536), allowed=_STRICT
    )
    if not isinstance(result, BaseException):
        assert isinstance(result, list)
        _plain(result)


_yaml_documents = st.one_of(
    s.json_like.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
    s.json_like.map(lambda v: yaml.safe_dump_all([v, v], explicit_start=True)),
)


@given(s.raw_bytes)
@example(b"labels: {release: 2024-02-30}")
@example(b"a: !!int x")
@example(b"a: " + b"9" * 4301)
@example(b"[" * 600 + b"]" * 600)
@example(b'a: "q\\ud800"')
@example(ALIAS_BOMB.encode())
@example(b"a: &a [*a]")
@example(b"a: !!python/object:os.system x")
@example(b"a: !!binary AAAA")
@example(b"a: .nan")
@example(b"a: !!int ")  # found by this harness: IndexError inside PyYAML
@example(b"a: !!float +")
def test_load_yaml_raw(data: bytes) -> None:
    _yaml(data)


@given(
    st.one_of(
        s.mutated(_yaml_documents.map(s.utf8)),
        s.deep("[", "]"),
        s.deep("{a: ", "}"),
        st.integers(1, 400).map(lambda n: "- " * n + "x"),
        st.builds(lambda tag, value: f"a: !!{tag} {value}", st.sampled_from(
            ["int", "float", "bool", "str", "null", "timestamp", "map", "seq", "set", "omap"]
        ), s.words),
    )
)  # fmt: skip
@example("a: !!map 0")  # found by the ci profile: ValueError out of construct_mapping
@example("a: !!map [1, 2]")
def test_load_yaml_documents(data: bytes | str) -> None:
    _yaml(data)


def _toml(data: bytes | str) -> None:
    result = outcome(
        "strict.loads_toml", lambda: loads_toml(data, what="fuzz", max_bytes=65536), allowed=_STRICT
    )
    if not isinstance(result, BaseException):
        assert isinstance(result, dict)
        text = data.decode() if isinstance(data, bytes) else data
        _plain(result, may_be_infinite="inf" in text or "nan" in text)


_toml_documents = st.builds(
    lambda key, value, table: f'[{table}]\n"{key}" = {value}\n',
    s.words,
    st.one_of(s.number_texts, s.words.map(lambda w: f'"{w}"'), st.just("[1, [2, [3]]]")),
    s.words,
)


@given(s.raw_bytes)
@example(b"a = " + b"[" * 600 + b"]" * 600)
@example(b"a = " + b"{b = " * 600 + b"}" * 600)
@example(b"a = " + b"9" * 4301)
@example(b'a = "\\ud800"')
@example(b"a = nan")
def test_loads_toml_raw(data: bytes) -> None:
    _toml(data)


@given(st.one_of(s.mutated(_toml_documents.map(s.utf8)), s.deep("a = [", "]")))
def test_loads_toml_documents(data: bytes) -> None:
    _toml(data)


@given(st.one_of(s.text, s.json_like), st.integers(0, 2 * CLIP_CHARS))
@example("\x1b]0;title\x07\x1b[2J", 300)
@example("\ud800" * 400, 300)
def test_clip(value: object, limit: int) -> None:
    result = outcome("strict.clip", lambda: clip(value, limit), allowed=())
    assert isinstance(result, str)
    shown = result.partition("…(")[0]
    assert len(shown) <= limit
    check_text(result, "strict.clip")


_HEADS = [
    b"GET /metrics HTTP/1.1\r\nHost: node:9446\r\nAccept: application/openmetrics-text;"
    b"version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1\r\n"
    b"Accept-Encoding: gzip\r\nUser-Agent: Prometheus/2.53.0\r\n\r\n",
    b"HEAD /metrics?name[]=x HTTP/1.0\r\n\r\n",
]


@given(st.one_of(s.raw_bytes, s.mutated(st.sampled_from(_HEADS))))
@example(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n")
@example(b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n")
@example(b"GET / HTTP/1.1\r\nAccept: a\r\naccept: b\r\n\r\n")
@example(b"GET / HTTP/1.1\r\n folded\r\n\r\n")
def test_parse_request_head(data: bytes) -> None:
    result = outcome("strict.parse_request_head", lambda: parse_request_head(data), allowed=_STRICT)
    if isinstance(result, RequestHead):
        assert result.method in data.decode("ascii")
        assert set(result.fields) <= {"accept", "accept-encoding", "content-length", "host"}
        assert len(data) <= MAX_HEAD_BYTES
