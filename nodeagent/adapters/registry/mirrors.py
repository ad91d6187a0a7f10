"""Where an image can be read from: registries.conf's mirrors, then its own registry.

Disk admission sizes images before CRI-O pulls them. On a disconnected site the images keep
their public names (``quay.io/...``) and CRI-O pulls them from a mirror that registries.conf
names; nodeagent must read their manifests from the same mirror, or their size stays unknown
and their set is held (``SizeUnknown``). The rules are containers/image's
(docs/runtime-facts.md, "containers registries.conf"): the ``[[registry]]`` entry with the
longest ``prefix`` matching the name applies (``prefix`` defaults to ``location``; a later
file's entry replaces an earlier one with the same key), each mirror's ``location`` replaces
the prefix, mirrors in order, the entry's own ``location`` last.

Only plain prefixes are understood; wildcard entries (``*.example.com``) and entries of the
wrong shape are skipped here (reading the files strictly is ``registries.insecure_registries``'
job, which refuses them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.registries import normalize_registry, parse_docker_digest_reference
from nodeagent.strict import MalformedInput, loads_toml

MAX_REGISTRIES_CONF_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Route:
    """One ``[[registry]]`` entry: names under ``prefix`` are read from ``mirrors``, then
    from ``location``."""

    prefix: str
    location: str
    mirrors: tuple[str, ...] = ()


def routes_of(files: Iterable[tuple[str, str]]) -> tuple[Route, ...]:
    """The routes of registries.conf and its drop-ins, given as (name, text) in reading order."""
    routes: dict[str, Route] = {}
    for name, text in files:
        try:
            doc = loads_toml(text, what=name, max_bytes=MAX_REGISTRIES_CONF_BYTES)
        except MalformedInput:
            continue
        entries = doc.get("registry")
        for entry in entries if isinstance(entries, list) else ():
            route = _route(entry)
            if route is not None:
                routes[route.prefix] = route
    return tuple(routes.values())


def _route(entry: Any) -> Route | None:
    if not isinstance(entry, dict):
        return None
    location, prefix = entry.get("location", ""), entry.get("prefix", "")
    if not isinstance(location, str) or not isinstance(prefix, str):
        return None
    key = _normalized(prefix or location)
    if not key or key.startswith("*"):
        return None
    mirrors = entry.get("mirror")
    found = [
        _normalized(m["location"])
        for m in (mirrors if isinstance(mirrors, list) else ())
        if isinstance(m, dict) and isinstance(m.get("location"), str) and m["location"]
    ]
    return Route(key, _normalized(location) or key, tuple(found))


def _normalized(location: str) -> str:
    host, slash, rest = location.strip().strip("/").partition("/")
    return normalize_registry(host) + slash + rest


def pull_sources(ref: str, routes: Sequence[Route]) -> list[str]:
    """The references to read ``ref`` (``host/repo@sha256:…``) from, in the order CRI-O tries
    them: its route's mirrors, then the route's location; ``[ref]`` without a route."""
    parsed = parse_docker_digest_reference(ref)
    name = f"{parsed.registry}/{parsed.repository}"
    matching = [r for r in routes if name == r.prefix or name.startswith(r.prefix + "/")]
    if not matching:
        return [ref]
    route = max(matching, key=lambda r: len(r.prefix))
    rest = name[len(route.prefix) :]
    return [f"{place}{rest}@{parsed.digest}" for place in (*route.mirrors, route.location)]
