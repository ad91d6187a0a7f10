"""The node mirror's state as the peer process reports it to the daemon
(``nodeagent.site.reports`` renders and parses it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MirrorReport:
    """The node mirror's state as the peer process reports it (counts since it started)."""

    serving: bool
    blobs: int
    """Bundle blobs it serves to any local client."""
    registry_blobs: int
    """Registry-set blobs it serves with the credential."""
    requests: int
    bytes_served: int
    missing: int
    """Manifests and blobs asked for that the store does not hold."""
    denied: int
    """Registry-set content asked for without the credential."""
