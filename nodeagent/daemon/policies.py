"""The policies services run under, built once from the configuration."""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.config import Config
from nodeagent.disk import DiskPolicy
from nodeagent.prepull import PullPolicy
from nodeagent.sync import SyncSchedule

BUNDLE_PULLS_AT_ONCE = 4
"""At most this many of ``pull.concurrency``: a bundle is served on loopback, so its pulls
wait on CPU and disk, never on a network; more in flight only add I/O-wait stalls
(docs/performance.md, bundle import)."""


@dataclass(frozen=True, slots=True)
class Policies:
    pull: PullPolicy
    """Registry pulls of the sync."""
    bundle_pull: PullPolicy
    """Pulls from a bundle served on loopback (fewer at once; no shared-layer ordering)."""
    disk: DiskPolicy
    schedule: SyncSchedule


def policies_from(config: Config) -> Policies:
    pull = config.pull
    return Policies(
        pull=PullPolicy(
            concurrency=pull.concurrency,
            attempts=pull.attempts,
            backoff_initial_s=pull.backoff_initial_s,
            backoff_max_s=pull.backoff_max_s,
            stall_timeout_s=pull.stall_timeout_s,
            shared_layer_min_bytes=pull.shared_layer_min_bytes,
        ),
        bundle_pull=PullPolicy(
            concurrency=min(pull.concurrency, BUNDLE_PULLS_AT_ONCE),
            attempts=pull.attempts,
            backoff_initial_s=pull.backoff_initial_s,
            backoff_max_s=pull.backoff_max_s,
            stall_timeout_s=pull.stall_timeout_s,
        ),
        disk=DiskPolicy(
            config.disk.expansion_factor, config.disk.reserve_bytes, config.disk.reserve_percent
        ),
        schedule=SyncSchedule(),
    )
