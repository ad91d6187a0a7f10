"""What a request to the node mirror names: the import-time mirror's wire rules
(``nodeagent.bundles.mirror.route``) plus the node mirror's own bounds.

* a path longer than ``MAX_PATH_CHARS`` is 414 before it is parsed;
* a manifest or blob is served under the repository names the store holds only
  (``repositories``: each stored image's repository path, as the drop-in's mirror location
  rewrites ``host/repo`` to ``127.0.0.1:22626/repo``); any other name is 404
  ``NAME_UNKNOWN``, so a client learns nothing of the store by guessing names;
* a tag is served only when a verified signed manifest lists it (``tags``); any other tag is
  404 ``MANIFEST_UNKNOWN``.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Final

from nodeagent.bundles.mirror import ErrorAnswer, Fetch, Request, route

MAX_PATH_CHARS: Final = 1024
"""Longest request path answered (a repository name of 255 characters and a digest fit
four times over); the request line itself is bounded by the listener (8 KiB)."""
_NAME_START: Final = "/v2/"
NAME_UNKNOWN: Final = ErrorAnswer(404, "NAME_UNKNOWN", "repository not held by this node")


@dataclass(frozen=True, slots=True)
class UnknownName:
    """A well-formed request under a repository the store does not hold: answered
    ``NAME_UNKNOWN``; its digest still counts as asked for and not held."""

    target: Fetch


def _name_of(path: str) -> str:
    """The ``<name>`` of ``/v2/<name>/(manifests|blobs)/<ref>`` (the route checked it)."""
    head = path[len(_NAME_START) :]
    for kind in ("/manifests/", "/blobs/"):
        index = head.rfind(kind)
        if index > 0:
            return head[:index]
    return ""


def route_node(
    method: str, path: str, repositories: Container[str]
) -> Fetch | ErrorAnswer | UnknownName:
    """What ``method path`` asks of the node mirror, or the error to answer."""
    if len(path) > MAX_PATH_CHARS:
        return ErrorAnswer(414, "UNSUPPORTED", "request path too long")
    target = route(Request(method, path))
    if isinstance(target, ErrorAnswer) or target.kind == "base":
        return target
    name = _name_of(path)
    return target if name in repositories else UnknownName(target)
