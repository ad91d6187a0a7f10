"""What a node does for its site, from its configuration alone (``[site]``, docs/site.md).

Kept apart from ``discovery`` so that the daemon's start decides which site tasks to run
without loading the code of the tasks it does not run.
"""

from __future__ import annotations

from nodeagent.config import Config


def is_following(config: Config) -> bool:
    """``[site] follow``: on, or auto in cluster mode or with static peers."""
    follow = config.site.follow
    return follow == "on" or (
        follow == "auto" and (config.cluster.enabled or bool(config.site.peers))
    )


def is_publishing(config: Config) -> bool:
    """Holdings are published in cluster mode when the node serves or follows."""
    return config.cluster.enabled and (config.site.serve or is_following(config))
