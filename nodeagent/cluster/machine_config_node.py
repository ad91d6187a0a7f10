"""The MachineConfigNode mirror (pure): the node's API sets as the machine-config-daemon
reports them, for the clusters where nodeagent owns them (decision 0044).

Only while nodeagent owns the API's sets (``cluster.ownership``): two writers of the same
conditions fight. Word for word what the machine-config-daemon writes, so a reader (the
console, ``oc describe mcn``, the pool's controller) sees one vocabulary whoever wrote it
(docs/runtime-facts.md, "machine-config-daemon behaviour"):

* ``PinnedImageSetsProgressing``: True, ``ImagePrefetch``, "node is prefetching images:
  <node>" while a set pulls; else False, ``AsExpected``, "All pinned image sets complete".
* ``PinnedImageSetsDegraded``: True, ``PrefetchFailed``, the failures; else False,
  ``AsExpected``, "All is good". A message that starts with ``Error:`` degrades the whole
  pool; the daemon writes that prefix only when the disk is too small, and so does nodeagent.

Bounds: the API's 100 sets and 32768 characters per ``lastFailedGenerationError``, with all
errors together within ``ERROR_BUDGET_CHARS`` (a short error leaves its share to the long
ones), so the object stays far below etcd's 1.5 MiB whatever the errors say.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from nodeagent.cluster.kinds import MACHINE_CONFIG_NODE
from nodeagent.cluster.objects import NodeIdentity, merge_conditions
from nodeagent.status import Condition, NodeStatus, SetStatus
from nodeagent.strict import clip

MAX_SETS: Final = 100
"""``status.pinnedImageSets`` maxItems."""
MAX_ERROR_CHARS: Final = 32768
"""maxLength of ``lastFailedGenerationError`` (and of a condition's message)."""
ERROR_BUDGET_CHARS: Final = 131072
"""All sets' errors together: at most 512 KiB even if every character took 4 bytes."""
MAX_DEGRADED_CHARS: Final = 4096
"""The Degraded condition's message (it names the failed sets; each error is in its entry)."""
CLIP_MARGIN: Final = 32
"""Room for ``clip``'s "…(N more characters)" within a limit."""

PROGRESSING: Final = "PinnedImageSetsProgressing"
DEGRADED: Final = "PinnedImageSetsDegraded"
REASON_PREFETCH: Final = "ImagePrefetch"
REASON_FAILED: Final = "PrefetchFailed"
REASON_AS_EXPECTED: Final = "AsExpected"
MESSAGE_COMPLETE: Final = "All pinned image sets complete"
MESSAGE_HEALTHY: Final = "All is good"
DEGRADE_PREFIX: Final = "Error:"
NO_SPACE_REASONS: Final = frozenset({"InsufficientDiskSpace", "NoSpaceLeft"})
"""nodeagent's reasons for "the disk is too small", the one failure the daemon degrades the
pool for."""


def error_shares(lengths: Sequence[int], budget: int, cap: int) -> list[int]:
    """Per entry, the characters its error may keep: each at most ``cap`` and its own length,
    all together at most ``budget``; what a short error leaves goes to the longer ones."""
    shares = [0] * len(lengths)
    remaining = budget
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for done, index in enumerate(order):
        share = min(cap, lengths[index], remaining // (len(order) - done))
        shares[index] = share
        remaining -= share
    return shares


def _kept(text: str, limit: int) -> str:
    """At most ``limit`` characters, control characters escaped, cut ones counted."""
    if len(text) <= limit and text.isprintable():
        return text
    return clip(text, max(limit - CLIP_MARGIN, 1))


def _failed(s: SetStatus) -> bool:
    return s.state in ("Degraded", "Refused")


def pinned_image_sets(sets: Sequence[SetStatus]) -> list[dict[str, Any]]:
    """The ``status.pinnedImageSets`` entries, errors within their shares."""
    errors = [s.last_failed_error or s.reason or s.state for s in sets]
    shares = error_shares([len(e) for e in errors], ERROR_BUDGET_CHARS, MAX_ERROR_CHARS)
    items = []
    for s, error, share in zip(sets, errors, shares, strict=True):
        item: dict[str, Any] = {"name": s.name, "desiredGeneration": s.desired_generation}
        if s.current_generation is not None:
            item["currentGeneration"] = s.current_generation
        if s.last_failed_generation is not None:
            item["lastFailedGeneration"] = s.last_failed_generation
            item["lastFailedGenerationError"] = _kept(error, share)
        items.append(item)
    return items


def conditions(node: str, sets: Sequence[SetStatus]) -> tuple[Condition, Condition]:
    """The two conditions, with the machine-config-daemon's reasons and messages."""
    if any(s.state == "Progressing" for s in sets):
        progressing = Condition(
            PROGRESSING, True, REASON_PREFETCH, f"node is prefetching images: {node}"
        )
    else:
        progressing = Condition(PROGRESSING, False, REASON_AS_EXPECTED, MESSAGE_COMPLETE)
    failed = [s for s in sets if _failed(s)]
    if not failed:
        return progressing, Condition(DEGRADED, False, REASON_AS_EXPECTED, MESSAGE_HEALTHY)
    text = "; ".join(f"{s.name}: {s.last_failed_error or s.reason or s.state}" for s in failed)
    if any(s.reason in NO_SPACE_REASONS for s in failed):
        text = f"{DEGRADE_PREFIX} {text}"
    return progressing, Condition(DEGRADED, True, REASON_FAILED, _kept(text, MAX_DEGRADED_CHARS))


def machine_config_node_status(
    node: NodeIdentity,
    status: NodeStatus,
    api_sets: Collection[str],
    previous_conditions: Sequence[Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    """Apply body for ``machineconfignodes/<node>/status``: the API's sets of this node only
    (``api_sets``: local and bundle sets are no MachineConfigPool's), as the daemon writes."""
    sets = [s for s in status.sets if s.name in api_sets][:MAX_SETS]
    return {
        "apiVersion": MACHINE_CONFIG_NODE.api_version,
        "kind": MACHINE_CONFIG_NODE.kind,
        "metadata": {"name": node.name},
        "status": {
            "conditions": merge_conditions(
                previous_conditions,
                conditions(node.name, sets),
                now,
                max_message_chars=MAX_DEGRADED_CHARS,
            ),
            "pinnedImageSets": pinned_image_sets(sets),
        },
    }
