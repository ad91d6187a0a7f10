"""Unit tests of nodeagent.registries.conf: registries.conf and its drop-ins read strictly.

Crash input of issue 13 kept as a regression case: a ``[registries] insecure = …`` table
(the v1 format, written wrong) ended the daemon with an unhandled exception.
"""

from __future__ import annotations

import pytest

from nodeagent.errors import ConfigInvalid, RegistriesConfInvalid
from nodeagent.registries import (
    MAX_REGISTRIES_CONF_BYTES,
    Mirror,
    RegistryEntry,
    insecure_registries,
    read_registries_conf,
)
from nodeagent.registries.conf import MAX_LOCATION_CHARS

V2 = """
unqualified-search-registries = ["quay.io"]
short-name-mode = "enforcing"
credential-helpers = ["containers-auth.json"]

[aliases]
"app" = "quay.io/team/app"

[[registry]]
prefix = "quay.io/team"
location = "quay.io/team"
blocked = false
mirror-by-digest-only = true
unknown-later-key = "kept away, as containers-image does"

[[registry.mirror]]
location = "mirror.local:5000/team/"
insecure = true
"""


def test_a_v2_file_with_every_field() -> None:
    conf = read_registries_conf([("registries.conf", V2)])
    assert conf.entries == (
        RegistryEntry(
            "quay.io/team",
            "quay.io/team",
            mirrors=(Mirror("mirror.local:5000/team", True, ""),),
            is_mirror_by_digest_only=True,
        ),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[registries.insecure]\nregistries = ["old.local:5000", "b.local/"]\n',
         {"old.local:5000", "b.local"}),
        ('[registries.search]\nregistries = ["quay.io"]\n', set()),
        ('[registries.block]\nregistries = ["bad.local"]\n', set()),
        ('[registries.insecure]\nregistries = []\n[[registry]]\nlocation = "a"\ninsecure = true\n',
         {"a"}),  # an empty v1 list is no v1 content
    ],
)  # fmt: skip
def test_the_v1_format_is_read_as_containers_image_converts_it(
    text: str, expected: set[str]
) -> None:
    assert insecure_registries(text, {}) == expected


def test_v1_blocked_and_insecure_locations_become_entries() -> None:
    text = (
        '[registries.insecure]\nregistries = ["a"]\n[registries.block]\nregistries = ["a", "b"]\n'
    )
    conf = read_registries_conf([("registries.conf", text)])
    assert conf.entries == (
        RegistryEntry("a", "a", is_insecure=True, is_blocked=True),
        RegistryEntry("b", "b", is_blocked=True),
    )


@pytest.mark.parametrize("table", ["search", "insecure", "block"])
def test_a_drop_in_in_the_v1_format_is_refused(table: str) -> None:
    text = f'[registries.{table}]\nregistries = ["a.local"]\n'
    refused = r"^RegistriesConfInvalid: 10-old\.conf: a drop-in must use"
    with pytest.raises(ConfigInvalid, match=refused):
        insecure_registries("", {"10-old.conf": text})


def test_a_later_drop_in_replaces_a_v1_entry_with_the_same_prefix() -> None:
    main = '[registries.insecure]\nregistries = ["a.local"]\n'
    later = '[[registry]]\nlocation = "a.local"\n'
    assert insecure_registries(main, {"10-secure.conf": later}) == frozenset()


LONG = "a" * (MAX_LOCATION_CHARS + 1)
BAD_FILES = {
    "v1 insecure as a list (issue 13)": ('[registries]\ninsecure = ["a"]\n', "registries.insecure"),
    "v1 insecure as a string": ('[registries]\ninsecure = "a"\n', "registries.insecure"),
    "registries as a string": ('registries = "a"\n', "'registries' is a string"),
    "v1 list of numbers": ("[registries.search]\nregistries = [1]\n", "list of strings"),
    "v1 mixed with v2": (
        '[registries.insecure]\nregistries = ["a"]\n[[registry]]\nlocation = "b"\n',
        "mixes the v1 format",
    ),
    "v1 mixed with search registries": (
        'unqualified-search-registries = ["b"]\n[registries.search]\nregistries = ["a"]\n',
        "mixes the v1 format",
    ),
    "registry not a list": ('registry = "a"\n', "array of tables"),
    "location a number": ("[[registry]]\nlocation = 5\n", "'location' must be a string"),
    "prefix a table": ("[[registry]]\nprefix = {a = 1}\n", "'prefix' must be a string"),
    "neither location nor prefix": ("[[registry]]\ninsecure = true\n", "needs 'location'"),
    "insecure a string": ('[[registry]]\nlocation = "a"\ninsecure = "yes"\n', "true or false"),
    "blocked a number": ('[[registry]]\nlocation = "a"\nblocked = 1\n', "'blocked'"),
    "mirror-by-digest-only a string": (
        '[[registry]]\nlocation = "a"\nmirror-by-digest-only = "true"\n',
        "'mirror-by-digest-only'",
    ),
    "pull-from-mirror unknown": (
        '[[registry]]\nlocation = "a"\npull-from-mirror = "sometimes"\n',
        "'pull-from-mirror' must be one of",
    ),
    "mirror a string": ('[[registry]]\nlocation = "a"\nmirror = "x"\n', "array of tables"),
    "mirror location a number": (
        '[[registry]]\nlocation = "a"\n[[registry.mirror]]\nlocation = 7\n',
        r"registry\[0\]\.mirror\[0\]: 'location' must be a string",
    ),
    "mirror without location": (
        '[[registry]]\nlocation = "a"\n[[registry.mirror]]\ninsecure = true\n',
        "needs a 'location'",
    ),
    "mirror insecure a string": (
        '[[registry]]\nlocation = "a"\n[[registry.mirror]]\nlocation = "m"\ninsecure = "no"\n',
        "true or false",
    ),
    "a location too long": (f'[[registry]]\nlocation = "{LONG}"\n', "characters long"),
    "short-name-mode unknown": ('short-name-mode = "lax"\n', "'short-name-mode'"),
    "search registries a string": (
        'unqualified-search-registries = "quay.io"\n', "list of strings"),
    "aliases a list": ('aliases = ["a"]\n', "'aliases' is an array"),
    "an alias a number": ("[aliases]\na = 1\n", "not a string"),
    "not TOML": ("[[registry]\n", "not valid TOML"),
    "a date as location": ("[[registry]]\nlocation = 2024-02-30\n", "not valid TOML"),
    "a lone surrogate": ('[[registry]]\nlocation = "\\ud800"\n', "not valid TOML"),
    "too large": ("#" * (MAX_REGISTRIES_CONF_BYTES + 1), "more than"),
    "nested deep": ("a = " + "[" * 200 + "]" * 200 + "\n", "nested"),
    # containers/image's postProcessRegistries rules (docs/runtime-facts.md)
    "both mirror forms": (
        '[[registry]]\nlocation = "a"\nmirror-by-digest-only = true\n'
        '[[registry.mirror]]\nlocation = "m"\npull-from-mirror = "digest-only"\n',
        "refuses the two forms together"),
    "pull-from-mirror on the entry": (
        '[[registry]]\nlocation = "a"\npull-from-mirror = "digest-only"\n',
        "mirror\\]\\] table only"),
    "a prefix without location": ('[[registry]]\nprefix = "a/b"\n', "no 'location'"),
    "a wildcard with a path": (
        '[[registry]]\nprefix = "*.a.com/x"\nlocation = "b"\n', "form \\*.example.com"),
    "a scheme": ('[[registry]]\nlocation = "https://a"\n', "URI scheme"),
    "a mirror scheme": (
        '[[registry]]\nlocation = "a"\n[[registry.mirror]]\nlocation = "http://m"\n',
        "URI scheme"),
    "conflicting blocked": (
        '[[registry]]\nprefix = "a/x"\nlocation = "a"\nblocked = true\n'
        '[[registry]]\nprefix = "a/y"\nlocation = "a"\n', "conflicting 'blocked'"),
    "conflicting insecure": (
        '[[registry]]\nprefix = "a/x"\nlocation = "a"\ninsecure = true\n'
        '[[registry]]\nprefix = "a/y"\nlocation = "a"\n', "conflicting 'insecure'"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_drop_in_is_refused_naming_the_file_and_the_key(name: str) -> None:
    text, message = BAD_FILES[name]
    with pytest.raises(RegistriesConfInvalid, match=message) as caught:
        insecure_registries('[[registry]]\nlocation = "ok"\n', {"50-bad.conf": text})
    shown = str(caught.value)
    assert isinstance(caught.value, ConfigInvalid)  # callers that catch ConfigInvalid still do
    assert shown.startswith("RegistriesConfInvalid: 50-bad.conf")
    assert len(shown) < 600
    assert LONG not in shown


def test_within_a_file_the_first_entry_with_a_prefix_counts_and_a_later_file_replaces_it() -> None:
    main = '[[registry]]\nlocation = "a"\n[[registry]]\nlocation = "a"\nblocked = false\n'
    main += '[[registry]]\nprefix = "b"\nlocation = "b1"\n'
    main += '[[registry]]\nprefix = "b"\nlocation = "b2"\n'
    conf = read_registries_conf([("registries.conf", main)])
    assert [e.location for e in conf.entries] == ["a", "b1"]
    conf = read_registries_conf(
        [("registries.conf", main), ("50.conf", '[[registry]]\nprefix = "b"\nlocation = "b3"\n')]
    )
    assert [e.location for e in conf.entries] == ["a", "b3"]
