"""Whether this node follows a bundle it sees on a peer (pure; docs/site.md, "Which bundles a
node fetches").

``decide`` is called with a manifest whose signature already verified against this node's
own keys (a peer is never trusted: an unverified manifest never gets here). It returns one
``FollowDecision``: follow, or skip with a reason code and what to tell a person. The rules,
in the order they are checked:

1. ``FollowOff``: ``[site] follow`` is ``off``, or ``auto`` on a node with neither cluster
   mode nor ``[site] peers``;
2. ``NotInTarget``: the bundle is for another architecture (``part="architecture"``), or
   its target's selector does not select this node (``part="selector"``); without the
   node's labels (no Kubernetes API) only a bundle without a selector is followed
   (``bundles.target.target_miss``);
3. ``DifferentManifestHeld``: the store holds the same bundle id with another signed
   manifest. Two manifests for one id is a conflict to report (``nodeagent site status``
   names it), never a reason to replace what the node holds;
4. ``AlreadyHeld``: the store holds this very manifest already (nothing to fetch; a fetch
   that was interrupted is the fetcher's to resume, not a new decision);
5. ``Expired``: the bundle's signed ``expires`` is past (``BundleExpired`` at import);
6. ``Rollback``: its sequence is lower than the highest this node accepted for the same
   signing key and channel, or equal with another manifest (``BundleRollback`` at import,
   ``bundles.freshness``): an older bundle a peer still holds is never fetched.

The architecture half comes before the held checks so that a node reports why it does not
take a bundle even when it holds an older copy of its id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from nodeagent.bundles.freshness import Stamp, check
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.bundles.target import TargetPart, describe_target, target_miss
from nodeagent.errors import BundleExpired
from nodeagent.strict import clip

FollowSetting = Literal["on", "off", "auto"]
FOLLOW_SETTINGS: Final = ("on", "off", "auto")
SkipReason = Literal[
    "FollowOff", "NotInTarget", "AlreadyHeld", "DifferentManifestHeld", "Expired", "Rollback"
]
SKIP_REASONS: Final[tuple[SkipReason, ...]] = (
    "FollowOff",
    "NotInTarget",
    "AlreadyHeld",
    "DifferentManifestHeld",
    "Expired",
    "Rollback",
)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the rule needs to know about this node; gathered by the daemon."""

    follow: FollowSetting
    is_cluster_mode: bool
    has_peers: bool
    architecture: str
    """The node's GOARCH name (``registries.node_platform(uname -m)``)."""
    labels: Mapping[str, str] | None
    """The Node object's labels; None when they are not known (no API, not listed yet)."""
    held: Mapping[str, str]
    """Bundle id → ``sha256:<hex>`` of the signed ``bundle.json`` the store holds."""
    accepted: tuple[Stamp, ...] = ()
    """The signed manifests the store keeps (``adapters.store.accepted``): high-water marks."""
    now_s: float | None = None
    """Unix time by this node's clock, for ``expires``; None: not checked (a caller that
    has no clock, such as ``site status``)."""


@dataclass(frozen=True, slots=True)
class FollowDecision:
    is_following: bool
    reason: SkipReason | None = None
    part: TargetPart | None = None
    """For ``NotInTarget``: which half of the target leaves the node out."""
    message: str = ""
    """For a person (the journal, ``site status``); bundle text in it is clipped."""


FOLLOW: Final = FollowDecision(is_following=True)


def is_follow_on(follow: FollowSetting, *, is_cluster_mode: bool, has_peers: bool) -> bool:
    """``[site] follow``: ``auto`` is on in cluster mode or with a static ``peers`` list."""
    if follow == "auto":
        return is_cluster_mode or has_peers
    return follow == "on"


def decide(
    manifest: BundleManifest,
    manifest_digest: str,
    node: NodeFacts,
    key_id_hex: str | None = None,
    linked: tuple[str, ...] = (),
) -> FollowDecision:
    """Follow ``manifest`` (signed, verified; ``manifest_digest`` the sha256 of its bytes;
    ``key_id_hex`` its signing key's id: without it the anti-rollback rule is not applied;
    ``linked`` the other key that signed it, ``freshness.with_links``)?"""
    bundle = clip(manifest.bundle_id, 128)
    if not is_follow_on(
        node.follow, is_cluster_mode=node.is_cluster_mode, has_peers=node.has_peers
    ):
        why = "off" if node.follow == "off" else "auto, and there is no cluster mode or peers list"
        return _skip("FollowOff", f"[site] follow is {why}: bundle {bundle} is not fetched")
    part = target_miss(
        manifest.architecture,
        manifest.target,
        node_labels=node.labels,
        node_architecture=node.architecture,
    )
    if part is not None:
        return _skip("NotInTarget", _not_in_target(manifest, node, part), part=part)
    held = node.held.get(manifest.bundle_id)
    if held is None:
        return _fresh(manifest, manifest_digest, node, key_id_hex, linked)
    if held != manifest_digest:
        return _skip(
            "DifferentManifestHeld",
            f"bundle {bundle}: this node holds another signed manifest for the same id "
            f"({held[:19]}…, the peer's is {manifest_digest[:19]}…); nothing is replaced: "
            "give each bundle its own id",
        )
    return _skip("AlreadyHeld", f"bundle {bundle} is already in this node's store")


def _fresh(
    manifest: BundleManifest,
    manifest_digest: str,
    node: NodeFacts,
    key_id_hex: str | None,
    linked: tuple[str, ...] = (),
) -> FollowDecision:
    """``Expired`` or ``Rollback`` when the import would refuse it, else follow (without the
    key's id only the expiry can be judged)."""
    now = None if node.now_s is None else dt.datetime.fromtimestamp(node.now_s, dt.UTC)
    candidate = manifest.stamp(key_id_hex or "", manifest_digest, linked if key_id_hex else ())
    refusal = check(candidate, manifest.expires, node.accepted if key_id_hex else (), now).refusal
    if refusal is None:
        return FOLLOW
    return _skip("Expired" if isinstance(refusal, BundleExpired) else "Rollback", refusal.message)


def _not_in_target(manifest: BundleManifest, node: NodeFacts, part: TargetPart) -> str:
    wanted = describe_target(manifest.architecture, manifest.target)
    bundle = clip(manifest.bundle_id, 128)
    if part == "architecture":
        return f"bundle {bundle} is for {wanted}; this node is {clip(node.architecture, 40)}"
    if node.labels is None:
        return f"bundle {bundle} is for {wanted}; this node's labels are not known (no API)"
    return f"bundle {bundle} is for {wanted}; this node's labels do not match"


def _skip(reason: SkipReason, message: str, *, part: TargetPart | None = None) -> FollowDecision:
    return FollowDecision(is_following=False, reason=reason, part=part, message=message)
