"""``[mirror]``: the always-on node mirror and its registries.conf drop-in (docs/mirror.md).

Its own module beside ``settings`` (which holds most other tables) to keep that file short;
``Config.mirror`` gathers it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

NODE_MIRROR_DROPIN_NAME: Final = "98-nodeagent-node-mirror.conf"
"""The node mirror's file in the runtime's registries.conf.d. It sorts before the import's
``99-nodeagent-bundle-mirror.conf``, which restates its entries (docs/decisions/0058)."""


@dataclass(frozen=True, slots=True)
class MirrorSettings:
    """The node mirror: the store served read-only on loopback to CRI-O, podman and skopeo,
    and the registries.conf drop-in that points them at it (``[mirror]``, docs/mirror.md)."""

    enabled: bool = True
    """Serve the store on ``listen`` and keep the drop-in
    (``/etc/containers/registries.conf.d/98-nodeagent-node-mirror.conf``) for exactly the
    repositories the store holds. Default true: a node that holds the content can pull it
    with the registry gone, and the registry stays the last resort. ``false`` removes the
    drop-in (and reloads CRI-O once)."""
    listen: str = "127.0.0.1:22626"
    """``address:port`` the node mirror binds, and the location the drop-in gives its
    consumers. Default loopback, port 22626 (one above OpenShift's registry-less
    control-plane registry, 22625). Plain HTTP: it must be a loopback address."""
    max_connections: int = 256
    """Connections the node mirror keeps open at once (all its clients are local, so one
    cap for all of them); one more is closed as soon as it is accepted
    (``connections_capped``). CRI-O pulling 64 images at once keeps far fewer. Default 256.
    Range: from 1 to 1024."""
    request_timeout_s: float = 60.0
    """A first request, an idle keep-alive connection and each send step of the node mirror
    end after this. Default 60. Range: greater than 0 and at most 3600 seconds."""
    miss_wait_s: float = 60.0
    """How long the node mirror holds a request for an image's manifest it cannot serve yet
    (not held, or not all its blobs held) while the daemon fetches it from the site's peers,
    before it answers 404 (decision 0061): a node with an empty store then gets the image in
    its first pull, not the retry after. Only on a node that fetches from peers (``[site]
    follow``); elsewhere nothing could bring it and a miss is answered at once. A digest no
    peer holds reaches the image's own registry this much later. Every request held counts against
    ``max_connections``; at most ``MAX_HELD`` are held at once, more are answered 404 at
    once. ``0`` answers 404 at once. Default 60. Range: from 0 to 600 seconds."""
    auth_file: Path = Path("/run/containers/0/auth.json")
    """The root-only auth file the daemon adds the node mirror's credential to when it holds
    none (podman's and skopeo's as root, and CRI-O's without ``global_auth_file``; a tmpfs,
    so a new credential each boot). Its other entries are kept; a file that is not JSON is
    left untouched. Entries for the mirror in CRI-O's ``global_auth_file`` and ``[pull]
    auth_file`` are accepted too, never written (docs/decisions/0057)."""
