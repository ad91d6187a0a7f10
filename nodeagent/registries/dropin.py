"""registries.conf.d drop-ins that put a loopback mirror first (pure, no I/O).

Two of nodeagent's files are rendered here: the node mirror's
``98-nodeagent-node-mirror.conf`` (docs/decisions/0058) and the import's
``99-nodeagent-bundle-mirror.conf`` (``bundles.mirror``, decision 0055). Each entry names one
repository (``host[:port]/path``, normalized as containers/image matches names:
``repository_name``) and restates the entry that applied to it before (``applying_entry``):
its location, ``insecure``, ``blocked`` and mirrors after ours. Only the per-mirror
``pull-from-mirror`` form is written (an ICSP's ``mirror-by-digest-only`` becomes
``digest-only`` on each mirror: the same pulls), so ours can be ``digest-only`` and, for
signed tags, ``tag-only``. The semantics relied on are in ``bundles.mirror``'s docstring and
docs/runtime-facts.md. Here, not in ``bundles``, so that the daemon's idle task that keeps
the node mirror's file loads none of the bundle modules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Final

from nodeagent.registries.conf import RegistriesConf, RegistryEntry
from nodeagent.registries.names import normalize_registry
from nodeagent.registries.names import repository_name as repository_name

_MIRROR_HOST: Final = re.compile(r"^([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\]):[0-9]{1,5}$")


_NAME: Final = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)


def is_repository_name(name: str) -> bool:
    """A repository name of the distribution spec (lower case, ``/``-separated components)."""
    return _NAME.match(name) is not None


def _repository_path(repository: str) -> str:
    return repository.partition("/")[2]


def _matched_length(name: str, prefix: str) -> int:
    """How much of ``name`` (``host/repository``) the ``prefix`` of a ``[[registry]]`` covers,
    or -1 (containers/image ``refMatchingPrefix``; ``*.host`` matches subdomains)."""
    if prefix.startswith("*."):
        index = name.find(prefix[1:])
        if index == -1 or "/" in name[:index]:
            return -1
        end = index + len(prefix) - 1
        return end if end == len(name) or name[end] in ":/@" else -1
    if name == prefix:
        return len(prefix)
    return len(prefix) if name.startswith(prefix) and name[len(prefix)] in ":/@" else -1


def _normalized_prefix(prefix: str) -> str:
    host, slash, rest = prefix.partition("/")
    return prefix if host.startswith("*.") else normalize_registry(host) + slash + rest


def applying_entry(conf: RegistriesConf, repository: str) -> tuple[RegistryEntry, str] | None:
    """The entry that applies to ``repository`` (the longest matching prefix, as the runtime
    picks it) and the part of the name its prefix leaves over (``/rest`` or empty)."""
    best: tuple[RegistryEntry, str] | None = None
    for entry in conf.entries:
        prefix = _normalized_prefix(entry.key)
        length = _matched_length(repository, prefix)
        if length >= 0 and (best is None or len(prefix) > len(_normalized_prefix(best[0].key))):
            best = entry, repository[length:]
    return best


def _mirror_table(location: str, *, is_insecure: bool, pull_from_mirror: str) -> list[str]:
    lines = ["[[registry.mirror]]", f"location = {json.dumps(location)}"]
    lines += ["insecure = true"] if is_insecure else []
    lines += [f"pull-from-mirror = {json.dumps(pull_from_mirror)}"] if pull_from_mirror else []
    return [*lines, ""]


def tag_only_mirror(repository: str, mirror_host: str) -> list[str]:
    """The mirror table that sends pulls by tag of ``repository`` (``host/repo``) to the
    mirror at ``mirror_host``: ``pull-from-mirror = "tag-only"``. Only for a repository a
    verified manifest serves tags of (``bundles.tags``): the mirror answers those tags with
    their signed digest and any other with 404, after which the runtime tries the next
    source (docs/decisions/0059)."""
    if not _MIRROR_HOST.match(mirror_host) or "/" not in repository:
        raise ValueError(f"{mirror_host!r}, {repository!r}: want HOST:PORT and HOST/REPOSITORY")
    location = f"{mirror_host}/{_repository_path(repository)}"
    return _mirror_table(location, is_insecure=True, pull_from_mirror="tag-only")


def _registry_table(
    repository: str,
    mirror_host: str,
    existing: tuple[RegistryEntry, str] | None,
    *,
    is_tagged: bool = False,
) -> list[str]:
    """``repository``'s entry: the loopback mirror first, then what applied to it before,
    restated for this prefix (location, insecure, blocked, mirrors, their pull policies).

    Only the per-mirror form is written: an ICSP entry's ``mirror-by-digest-only`` becomes
    ``pull-from-mirror = "digest-only"`` on each of its mirrors, which containers/image
    treats the same (``PullSourcesFromReference``), so our own mirror can carry its own
    policy; an entry mixing the two forms is refused by every consumer (docs/runtime-facts.md).
    """
    entry, rest = existing if existing is not None else (RegistryEntry(repository, ""), "")
    location = f"{entry.location}{rest}" if entry.location else repository
    lines = ["[[registry]]", f"prefix = {json.dumps(repository)}"]
    lines.append(f"location = {json.dumps(location)}")
    lines += ["insecure = true"] if entry.is_insecure else []
    lines += ["blocked = true"] if entry.is_blocked else []
    lines.append("")
    mirror = f"{mirror_host}/{_repository_path(repository)}"
    lines += _mirror_table(mirror, is_insecure=True, pull_from_mirror="digest-only")
    if is_tagged:  # the tags a verified signed manifest lists (issue 25, item 3)
        lines += tag_only_mirror(repository, mirror_host)
    for kept in entry.mirrors:
        policy = "digest-only" if entry.is_mirror_by_digest_only else kept.pull_from_mirror
        lines += _mirror_table(
            f"{kept.location}{rest}", is_insecure=kept.is_insecure, pull_from_mirror=policy
        )
    return lines


IMPORT_HEADER: Final = (
    "# Written by nodeagent while it imports an offline bundle; removed afterwards.",
    "# Pulls by digest of these repositories are served by the bundle server on",
    "# loopback; names and digests stay those of the original registry. Each entry",
    "# restates the configuration that applied to its repository before.",
)
NODE_MIRROR_HEADER: Final = (
    "# Written by nodeagent: the repositories its node store holds, served by the node",
    "# mirror on loopback (docs/mirror.md). Rewritten when the store's holdings or another",
    "# registries.conf file change; removed with [mirror] enabled = false or nodeagent.",
    "# Each entry restates the configuration that applied to its repository before:",
    "# edit that file, not this one.",
)
_HOST: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")


def is_mirrorable(repository: str) -> bool:
    """Whether ``repository`` is a normalized ``host[:port]/path`` a drop-in may name (the
    distribution grammar: nothing a TOML string or a prefix match could misread)."""
    host, slash, path = repository.partition("/")
    return bool(slash) and _HOST.match(host) is not None and is_repository_name(path)


def blocked_sources(repositories: Iterable[str], existing: RegistriesConf) -> tuple[str, ...]:
    """The ``repositories`` whose source registry is ``blocked`` (OpenShift's
    ``NeverContactSource``): the mirrors are their only way, no fallback to the source."""
    blocked = []
    for repository in sorted(set(repositories)):
        applying = applying_entry(existing, repository)
        if applying is not None and applying[0].is_blocked:
            blocked.append(repository)
    return tuple(blocked)


def render_mirror_dropin(
    repositories: Iterable[str],
    mirror_host: str,
    existing: RegistriesConf | None = None,
    *,
    tagged: Iterable[str] = (),
    header: Iterable[str] = IMPORT_HEADER,
) -> str:
    """The registries.conf.d drop-in mirroring each ``host/repo`` at ``mirror_host/repo``.

    ``mirror_host`` is the bundle server's or the node mirror's ``127.0.0.1:<port>``; the
    mirror is plain HTTP (``insecure``), which is why it must only ever listen on loopback.
    ``existing``: registries.conf and its other drop-ins as the runtime reads them without
    this one. The drop-in's entry for a repository replaces (or, by its longer prefix,
    overrides) the one that applied to it, so it restates that entry: its location, its
    ``insecure`` and ``blocked``, and its mirrors after the loopback one, each with its own
    ``insecure`` and ``pull-from-mirror`` (docs/decisions/0055, 0058). Our mirror is
    ``digest-only``; the repositories in ``tagged`` (mirrored even when ``repositories``
    does not list them) get it a second time as ``tag-only``, for the tags a signed
    manifest lists.
    A blocked source stays blocked: the runtime still pulls from its mirrors, the loopback
    one included, never from the source itself (``blocked_sources``).
    """
    if not _MIRROR_HOST.match(mirror_host):
        raise ValueError(f"mirror host {mirror_host!r} must be HOST:PORT, without a scheme")
    lines = [*header, ""]
    conf = existing or RegistriesConf()
    tagged_set = frozenset(tagged)
    for repository in sorted(set(repositories) | tagged_set):
        if not is_mirrorable(repository):
            raise ValueError(f"repository {repository!r} must be HOST/REPOSITORY")
        lines += _registry_table(
            repository,
            mirror_host,
            applying_entry(conf, repository),
            is_tagged=repository in tagged_set,
        )
    return "\n".join(lines)
