"""Where an image can be read from: registries.conf's mirrors, then its own registry.

Disk admission sizes images before CRI-O pulls them. On a disconnected site the images keep
their public names (``quay.io/...``) and CRI-O pulls them from a mirror that registries.conf
names; nodeagent must read their manifests from the same mirror, or their size stays unknown
and their set is held (``SizeUnknown``). The rules are containers/image's
(docs/runtime-facts.md, "containers registries.conf"): the ``[[registry]]`` entry with the
longest ``prefix`` matching the name applies (``prefix`` defaults to ``location``; a later
file's entry replaces an earlier one with the same key), each mirror's ``location`` replaces
the prefix, mirrors in order, the entry's own ``location`` last.

The files are read strictly by ``registries.read_registries_conf`` (a broken file is
``ConfigInvalid`` naming the file and key). Only plain prefixes route here; wildcard
entries (``*.example.com``) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nodeagent.registries import (
    RegistriesConf,
    normalize_registry,
    parse_docker_digest_reference,
    read_registries_conf,
)


@dataclass(frozen=True, slots=True)
class Route:
    """One ``[[registry]]`` entry: names under ``prefix`` are read from ``mirrors``, then
    from ``location``."""

    prefix: str
    location: str
    mirrors: tuple[str, ...] = ()


def routes_of(files: Iterable[tuple[str, str]]) -> tuple[Route, ...]:
    """The routes of registries.conf and its drop-ins, given as (name, text) in reading order;
    ``ConfigInvalid`` for a broken file."""
    return routes_from(read_registries_conf(files))


def routes_from(conf: RegistriesConf) -> tuple[Route, ...]:
    """The routes of read registries.conf files: one per entry with a plain prefix."""
    routes: dict[str, Route] = {}
    for entry in conf.entries:
        key = _normalized(entry.key)
        if not key or key.startswith("*"):
            continue
        mirrors = tuple(_normalized(mirror.location) for mirror in entry.mirrors)
        routes[key] = Route(key, _normalized(entry.location) or key, mirrors)
    return tuple(routes.values())


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
