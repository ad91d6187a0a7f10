"""Whether registry pulls may start on this node, and at what pace (pure, plus a small holder).

From the Node object the informer keeps (docs/runtime-facts.md, "machine-config-daemon
behaviour"; docs/decisions/0043):

* the Node's ``Ready`` condition is not ``True`` (``False`` or ``Unknown``): registry pulls
  wait, reason ``NodeNotReady``; a Node whose kubelet never reported a ``Ready`` condition is
  not held (nothing is known to be wrong; such a Node exists only before its kubelet's first
  report);
* ``DiskPressure`` is ``True``: registry pulls wait, reason ``NodeDiskPressure``;
* a control-plane node (label ``node-role.kubernetes.io/master`` or
  ``node-role.kubernetes.io/control-plane``): one registry pull at a time, with
  ``[cluster] control_plane_pull_pause_s`` between two pulls.

Restores from the node's store and bundle imports never ask: after a power cut a node is
often NotReady exactly because its images are gone. Before the Node is known (the API not
listed yet) registry pulls are neither held nor paced, as before cluster mode knew them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from nodeagent.ports import PullTerms
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/master", "node-role.kubernetes.io/control-plane")


def is_control_plane(labels: Mapping[str, str]) -> bool:
    return any(label in labels for label in CONTROL_PLANE_LABELS)


def pull_terms(node: Mapping[str, Any], pause_s: float) -> PullTerms:
    """The terms registry pulls start under on this Node (the API object as decoded JSON)."""
    metadata = node.get("metadata") or {}
    name = clip(str(metadata.get("name", "")))
    labels = metadata.get("labels") or {}
    paced = is_control_plane(labels) if isinstance(labels, Mapping) else False
    terms = PullTerms(one_at_a_time=paced, pause_s=pause_s if paced else 0.0)
    conditions = _conditions(node)
    ready = conditions.get("Ready")
    if ready is not None and ready[0] != "True":
        return PullTerms(
            "NodeNotReady",
            f"the Node {name} is not Ready (Ready={clip(ready[0], 16)}, "
            f"{clip(ready[1], 80) or 'no reason given'}): registry pulls start once the kubelet "
            "reports it Ready; images are still restored from the node's store and bundles",
            terms.one_at_a_time,
            terms.pause_s,
        )
    pressure = conditions.get("DiskPressure")
    if pressure is not None and pressure[0] == "True":
        return PullTerms(
            "NodeDiskPressure",
            f"the Node {name} reports DiskPressure: registry pulls start once the kubelet "
            "clears it (free space on the image filesystem)",
            terms.one_at_a_time,
            terms.pause_s,
        )
    return terms


def _conditions(node: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of the Node's conditions; malformed entries are skipped."""
    items = (node.get("status") or {}).get("conditions") or []
    found: dict[str, tuple[str, str]] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("type"), str):
            found[item["type"]] = (str(item.get("status", "")), str(item.get("reason", "")))
    return found


class PullGate:
    """The current ``PullTerms`` of this node, from each Node the informer gives; a change is
    logged once and wakes ``follow``'s callback (a sync, so held pulls start again)."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s
        self.terms = PullTerms()
        self.changed = asyncio.Event()

    def current(self) -> PullTerms:
        return self.terms

    def observe(self, node: Mapping[str, Any]) -> None:
        terms = pull_terms(node, self.pause_s)
        if terms == self.terms:
            return
        if terms.held_reason and terms.held_reason != self.terms.held_reason:
            log.warning("registry_pulls_held", reason=terms.held_reason, error=terms.held_message)
        elif not terms.held_reason and self.terms.held_reason:
            log.info("registry_pulls_resumed", previous_reason=self.terms.held_reason)
        if terms.one_at_a_time != self.terms.one_at_a_time:
            log.info(
                "registry_pull_pace",
                one_at_a_time=terms.one_at_a_time,
                pause_s=terms.pause_s,
                why="control-plane node" if terms.one_at_a_time else "not a control-plane node",
            )
        self.terms = terms
        self.changed.set()

    async def follow(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` after every change of the terms (until cancelled)."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            on_change()
