"""``[mirror]``: the node mirror, the store served read-only on loopback (docs/mirror.md).

Its own module beside ``settings`` (as ``site``); ``Config.mirror`` gathers it with the rest.
The registries.conf drop-in that points the runtime at the mirror reads ``enabled`` and
``listen`` from here, and is named ``NODE_MIRROR_DROPIN_NAME``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

NODE_MIRROR_DROPIN_NAME: Final = "98-nodeagent-node-mirror.conf"
"""The node mirror's drop-in in ``[runtime] registries_dir``: ``.conf`` (else ignored),
sorting before the import-time mirror's ``99-nodeagent-bundle-mirror.conf``, which
restates (and so replaces) an entry of the same prefix while an import runs."""
NODE_MIRROR_PORT: Final = 22626
"""The documented port: beside the InternalReleaseImage registry's 22625 (docs/mirror.md)."""


@dataclass(frozen=True, slots=True)
class MirrorSettings:
    """The node mirror (``[mirror]``, docs/mirror.md): the store's verified content served
    read-only over the OCI distribution API on loopback, by digest and by the signature tags
    a verified signed manifest lists, so CRI-O, podman and skopeo pull what the node holds
    while the registry is gone. Served by the unprivileged peer process
    (``nodeagent serve-peers``); bundle content to any local client, registry-set content
    only to a client presenting the mirror's credential (decision 0057)."""

    enabled: bool = True
    """Serve the node mirror. Default true: it answers 404 to everything while the store is
    empty, costs no memory before its first connection beyond a listening socket, and a
    stopped mirror never breaks a pull (the source stays the last resort)."""
    listen: str = f"127.0.0.1:{NODE_MIRROR_PORT}"
    """``address:port`` the mirror binds: plain HTTP, so a loopback address only
    (``127.0.0.0/8`` or ``[::1]``). Default ``127.0.0.1:22626``."""
    max_connections: int = 256
    """Connections kept open at once (all its clients are local, so one cap for all of them);
    one more is closed as soon as it is accepted (``connections_capped``). CRI-O pulling 64
    images at once keeps far fewer. Default 256. Range: from 1 to 1024."""
    request_timeout_s: float = 60.0
    """A first request, an idle keep-alive connection and each send step end after this.
    Default 60. Range: greater than 0 and at most 3600 seconds."""
    auth_file: Path = Path("/run/containers/0/auth.json")
    """The root-only auth file the daemon adds the mirror's credential to when it holds none
    (podman's and skopeo's as root, and CRI-O's without ``global_auth_file``; a tmpfs, so a
    new credential each boot). Its other entries are kept; a file that is not JSON is left
    untouched. Entries for the mirror in CRI-O's ``global_auth_file`` and ``[pull]
    auth_file`` are accepted too, never written (decision 0057)."""
