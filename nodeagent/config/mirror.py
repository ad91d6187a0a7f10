"""``[mirror]``: the always-on node mirror and its registries.conf drop-in (docs/mirror.md).

Its own module beside ``settings`` (which holds most other tables) to keep that file short;
``Config.mirror`` gathers it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
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
