"""registries.conf and its drop-ins, read strictly (pure, no I/O).

``read_registries_conf`` reads the main file and its ``registries.conf.d`` drop-ins,
given as ``(name, text)`` in reading order (the main file, then the drop-ins in
lexical name order), the way containers-registries.conf(5) describes them: a later
file's ``[[registry]]`` entry replaces an earlier one with the same ``prefix`` (which
defaults to its ``location``). Each file is strict TOML (``nodeagent.strict.loads_toml``:
UTF-8, at most ``MAX_REGISTRIES_CONF_BYTES``) and every field nodeagent or CRI-O reads
is type-checked: strings are strings of at most ``MAX_LOCATION_CHARS`` characters,
booleans are booleans, ``mirror`` is a list of tables each with a ``location``, the
enumerations hold one of their values. Unknown keys are left alone, as containers-image
leaves them. A wrong type raises ``RegistriesConfInvalid`` (a ``ConfigInvalid``) naming the
file and the key.

Each file is also held to the rules containers/image checks when it loads it
(``postProcessRegistries``, docs/runtime-facts.md), any of which makes every pull on the
node fail: ``pull-from-mirror`` only in a mirror table, never beside the entry's
``mirror-by-digest-only``; a ``prefix`` without a ``location`` only as ``*.example.com``;
a wildcard prefix without ``/``, ``:`` or ``@``; no URI scheme in a location; two entries of
one file with the same location agree on ``insecure`` and ``blocked``. Within one file the
first entry with a prefix counts (containers/image ignores later ones).

The v1 format (``[registries.search]``, ``[registries.insecure]``,
``[registries.block]``, each with a ``registries`` list of strings) is read as
containers-image converts it: every insecure or blocked location becomes an entry
with that prefix. As in containers-image (docs/runtime-facts.md), only the main file may
use it: a drop-in with v1 tables, or any file that mixes v1 tables with v2 keys, is
refused.

``insecure_registries`` gives the locations reached over plain HTTP (entries and mirrors
marked ``insecure = true``); ``is_insecure`` matches a name against them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import RegistriesConfInvalid
from nodeagent.registries.names import normalize_registry
from nodeagent.strict import MalformedInput, clip, loads_toml, quoted

MAX_REGISTRIES_CONF_BYTES: Final = 1024 * 1024
"""A larger registries.conf or drop-in is refused; real ones are a few KiB."""
MAX_LOCATION_CHARS: Final = 512
"""Longer prefixes, locations and other strings are refused (a host is 253 at most)."""
_V1_TABLES: Final = ("search", "insecure", "block")
_V2_KEYS: Final = (
    "registry",
    "unqualified-search-registries",
    "short-name-mode",
    "aliases",
    "credential-helpers",
)
_PULL_FROM_MIRROR: Final = frozenset({"", "all", "digest-only", "tag-only"})
_SHORT_NAME_MODES: Final = frozenset({"", "enforcing", "permissive", "disabled"})


@dataclass(frozen=True, slots=True)
class Mirror:
    location: str
    is_insecure: bool = False
    pull_from_mirror: str = ""
    """``""``, ``all``, ``digest-only`` or ``tag-only``."""


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """One ``[[registry]]`` entry (or one location of the v1 format), checked."""

    prefix: str
    location: str
    is_insecure: bool = False
    is_blocked: bool = False
    mirrors: tuple[Mirror, ...] = ()
    is_mirror_by_digest_only: bool = False
    """``mirror-by-digest-only``: every mirror only for pulls by digest (ICSP renders it)."""

    @property
    def key(self) -> str:
        """What a later file's entry must repeat to replace this one."""
        return self.prefix or self.location


@dataclass(frozen=True, slots=True)
class RegistriesConf:
    """The entries of registries.conf and its drop-ins, later files' entries replacing
    earlier ones with the same key, in the order they were first given."""

    entries: tuple[RegistryEntry, ...] = ()


class _Bad(Exception):
    """A field that breaks a rule; the reader turns it into ``ConfigInvalid``."""


def read_registries_conf(files: Iterable[tuple[str, str]]) -> RegistriesConf:
    """Every file's entries (see the module docstring), or ``RegistriesConfInvalid``."""
    entries: dict[str, RegistryEntry] = {}
    for number, (path, text) in enumerate(files):
        name = clip(path, 200)  # a file name, shown: escaped like any other text
        try:
            doc = loads_toml(text, what=name, max_bytes=MAX_REGISTRIES_CONF_BYTES)
        except MalformedInput as err:
            raise RegistriesConfInvalid(f"{err}; fix the file") from None
        try:
            found = _file_entries(doc, is_dropin=number > 0)
            _check_conflicts(found)
        except _Bad as err:
            raise RegistriesConfInvalid(f"{name}: {err}; fix the file") from None
        first: dict[str, RegistryEntry] = {}
        for entry in found:  # within a file the first entry with a prefix counts
            first.setdefault(entry.key, entry)
        entries.update(first)
    return RegistriesConf(tuple(entries.values()))


def _check_conflicts(found: list[RegistryEntry]) -> None:
    """containers/image: entries of one file that share a location agree on ``insecure``
    and ``blocked`` (the location, or the prefix of an entry without one)."""
    seen: dict[str, RegistryEntry] = {}
    for entry in found:
        where = entry.location or entry.prefix
        other = seen.setdefault(where, entry)
        for flag, name in (("is_insecure", "insecure"), ("is_blocked", "blocked")):
            if getattr(other, flag) != getattr(entry, flag):
                raise _Bad(
                    f"registry {quoted(where, 120)} is defined more than once with "
                    f"conflicting {name!r} settings"
                )


def _file_entries(doc: Mapping[str, Any], *, is_dropin: bool) -> list[RegistryEntry]:
    v1 = _v1_lists(doc.get("registries"))
    if any(v1.values()):
        mixed = [key for key in _V2_KEYS if key in doc]
        if mixed:
            raise _Bad(
                f"it mixes the v1 format ([registries.*] tables) with v2 keys ({mixed[0]!r}); "
                "containers-image refuses that: write every entry as a [[registry]] table"
            )
        if is_dropin:
            raise _Bad(
                "a drop-in must use the v2 format (containers-image refuses [registries.*] "
                "tables there): write every entry as a [[registry]] table"
            )
        return _v1_entries(v1)
    _check_v2_keys(doc)
    return [_entry(item, f"registry[{i}]") for i, item in enumerate(_tables(doc, "registry"))]


def _v1_lists(table: Any) -> dict[str, list[str]]:
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise _Bad(f"'registries' is {_type_name(table)}; the v1 format makes it a table")
    lists: dict[str, list[str]] = {}
    for kind in _V1_TABLES:
        sub = table.get(kind)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise _Bad(
                f"'registries.{kind}' is {_type_name(sub)}; the v1 format makes it a table: "
                f'[registries.{kind}] registries = ["host", ...]'
            )
        lists[kind] = _strings(sub, "registries", f"registries.{kind}.registries")
    return lists


def _v1_entries(v1: Mapping[str, list[str]]) -> list[RegistryEntry]:
    """containers-image's conversion: one entry per insecure or blocked location."""
    flags: dict[str, tuple[bool, bool]] = {}
    for location in v1.get("insecure", []):
        flags[location] = (True, flags.get(location, (False, False))[1])
    for location in v1.get("block", []):
        flags[location] = (flags.get(location, (False, False))[0], True)
    return [
        RegistryEntry(location, location, is_insecure=insecure, is_blocked=blocked)
        for location, (insecure, blocked) in flags.items()
    ]


def _check_v2_keys(doc: Mapping[str, Any]) -> None:
    _strings(doc, "unqualified-search-registries", "unqualified-search-registries")
    _strings(doc, "credential-helpers", "credential-helpers")
    _choice(doc, "short-name-mode", _SHORT_NAME_MODES, "short-name-mode")
    aliases = doc.get("aliases", {})
    if not isinstance(aliases, dict):
        raise _Bad(f"'aliases' is {_type_name(aliases)}, not a table")
    for alias, target in aliases.items():
        _bounded(alias, f"aliases key {quoted(alias, 60)}")
        if not isinstance(target, str):
            raise _Bad(f"'aliases.{clip(alias, 60)}' is {_type_name(target)}, not a string")
        _bounded(target, f"aliases.{clip(alias, 60)}")


def _entry(table: Mapping[str, Any], where: str) -> RegistryEntry:
    location = _location(table, "location", where)
    prefix = _location(table, "prefix", where)
    if not (location or prefix):
        raise _Bad(f"{where} needs 'location' or 'prefix'")
    if prefix and not location and not prefix.startswith("*."):
        raise _Bad(f"{where} has a 'prefix' but no 'location': only *.example.com may")
    if prefix.startswith("*.") and any(c in prefix for c in "/@:"):
        raise _Bad(f"{where}: a wildcard 'prefix' must be of the form *.example.com")
    by_digest_only = _bool(table, "mirror-by-digest-only", where)
    if _choice(table, "pull-from-mirror", _PULL_FROM_MIRROR, where):
        raise _Bad(f"{where}: 'pull-from-mirror' belongs in a [[registry.mirror]] table only")
    mirrors = []
    for i, mirror in enumerate(_tables(table, "mirror", where)):
        at = f"{where}.mirror[{i}]"
        mirror_location = _location(mirror, "location", at)
        if not mirror_location:
            raise _Bad(f"{at} needs a 'location'")
        pull_from = _choice(mirror, "pull-from-mirror", _PULL_FROM_MIRROR, at)
        if pull_from and by_digest_only:
            raise _Bad(
                f"{at}: 'pull-from-mirror' with the entry's 'mirror-by-digest-only': "
                "containers/image refuses the two forms together; keep one"
            )
        is_insecure = _bool(mirror, "insecure", at)
        mirrors.append(Mirror(mirror_location.strip("/"), is_insecure, pull_from))
    return RegistryEntry(
        prefix=prefix.strip("/"),
        location=location.strip("/"),
        is_insecure=_bool(table, "insecure", where),
        is_blocked=_bool(table, "blocked", where),
        mirrors=tuple(mirrors),
        is_mirror_by_digest_only=by_digest_only,
    )


def _tables(doc: Mapping[str, Any], key: str, where: str = "") -> list[Mapping[str, Any]]:
    value = doc.get(key, [])
    name = f"{where}.{key}" if where else key
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _Bad(f"{name!r} must be an array of tables ([[{name}]])")
    return value


def _string(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise _Bad(f"{where}: {key!r} must be a string, not {_type_name(value)}")
    _bounded(value, f"{where}.{key}")
    return value


def _location(table: Mapping[str, Any], key: str, where: str) -> str:
    value = _string(table, key, where)
    if value.startswith(("http://", "https://")):
        raise _Bad(f"{where}: {key!r} must not have a URI scheme (http:// or https://)")
    return value


def _bool(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise _Bad(f"{where}: {key!r} must be true or false, not {_type_name(value)}")
    return value


def _choice(table: Mapping[str, Any], key: str, allowed: frozenset[str], where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or value not in allowed:
        wanted = ", ".join(repr(v) for v in sorted(allowed) if v)
        raise _Bad(f"{where}: {key!r} must be one of {wanted}, not {clip(repr(value), 60)}")
    return value


def _strings(table: Mapping[str, Any], key: str, name: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Bad(f"{name!r} must be a list of strings")
    for item in value:
        _bounded(item, name)
    return [item.strip("/") for item in value]


def _bounded(value: str, name: str) -> None:
    if len(value) > MAX_LOCATION_CHARS:
        raise _Bad(f"{name!r} is {len(value)} characters long, more than {MAX_LOCATION_CHARS}")


def _type_name(value: Any) -> str:
    names = {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(value), "a number or a date")


# ---------------------------------------------------------------- insecure locations
def insecure_registries(
    registries_conf_text: str,
    dropin_texts: Mapping[str, str],
    *,
    source: str = "registries.conf",
) -> frozenset[str]:
    """Locations that registries.conf and its drop-ins (applied in name order) mark
    ``insecure = true``: entries and mirrors, and the v1 ``[registries.insecure]`` list.
    Locations keep their namespace path, if any (``reg.example.com/team``); see
    ``is_insecure``."""
    files = [(source, registries_conf_text), *sorted(dropin_texts.items())]
    return insecure_locations(read_registries_conf(files))


def insecure_locations(conf: RegistriesConf) -> frozenset[str]:
    flags: dict[str, bool] = {}
    for entry in conf.entries:
        flags[entry.location or entry.prefix] = entry.is_insecure
        flags.update((mirror.location, mirror.is_insecure) for mirror in entry.mirrors)
    return frozenset(location for location, is_flagged in flags.items() if is_flagged)


def is_insecure(registry: str, repository: str, insecure: Iterable[str]) -> bool:
    """Whether ``registry/repository`` falls under one of the ``insecure`` locations."""
    segments = [registry, *repository.split("/")]
    for location in insecure:
        wanted = location.strip("/").split("/")
        wanted[0] = normalize_registry(wanted[0])
        if segments[: len(wanted)] == wanted:
            return True
    return False
