"""``[upgrade]``: what nodeagent does around an OpenShift upgrade (docs/upgrade.md).

Its own module beside ``settings`` (which holds most tables) to keep that file short;
``Config.upgrade`` gathers it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

UPGRADE_START_MODES: Final = ("never", "when-site-ready")
"""``[upgrade] start``: the values ``loading`` accepts."""
MIN_KEEP_RELEASES: Final = 2
"""The current release and the one before it are always kept (issue 26)."""


@dataclass(frozen=True, slots=True)
class UpgradeSettings:
    """Release retirement and the one-touch upgrade (``[upgrade]``, cluster mode only)."""

    keep_releases: int = 2
    """Release bundles kept pinned once an upgrade has completed everywhere: the current
    release and the newest ones before it, so many in all; older ones are unpinned and
    their blobs collected after ``[store] gc_grace_s`` (their signed manifests and
    signatures stay: the anti-rollback marks are derived from them). Default 2: the
    current release and the previous one, which a single node with one disk can hold,
    and the one to go back to while the new one settles. Range: from 2 to 100."""
    start: str = "never"
    """``"never"`` (default): an admin starts the upgrade (``oc adm upgrade``).
    ``"when-site-ready"``: once every node of a release bundle's scope has pinned it and
    the cluster's current version is one it upgrades from, one agent (elected by a Lease)
    sets ClusterVersion's ``desiredUpdate`` to the release image by digest. Needs the
    opt-in deploy/opt-in/upgrade-start.yaml; default never, since starting an upgrade is
    the cluster owner's decision."""
