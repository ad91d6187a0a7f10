"""The site view's values (pure): one Node's standing for a bundle (``NodeReport``) and a
bundle's view over every Node in scope (``BundleView``), for a person and as JSON.

``nodeagent.cluster.site`` builds them from the Node and NodeImageStatus objects; every text
in them was clipped and escaped there (``strict.clip``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.cluster.holdings import DigestConflict, Holder
from nodeagent.units import format_bytes

Verdict = Literal[
    "pinned", "holding", "progressing", "failing", "absent", "no-status", "stale", "unreadable"
]

HOLDING_STATES = frozenset({"stored", "importing", "imported", "pinned"})


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One Node's standing for the bundle (and set)."""

    node: str
    verdict: Verdict
    state: str = ""
    """The bundle's step on the node (or the set's state with ``--set``); ``""``: none."""
    reason: str = ""
    message: str = ""
    bytes_left: int | None = None
    """Bytes the current step still has to copy; None: unknown or nothing in progress."""
    images_total: int | None = None

    @property
    def is_pinned(self) -> bool:
        return self.verdict == "pinned"

    @property
    def is_holding(self) -> bool:
        return self.verdict == "pinned" or self.state in HOLDING_STATES

    def why(self) -> str:
        """Why the node is not pinned, for a person (already clipped)."""
        match self.verdict:
            case "no-status":
                return "no status (nodeagent never reported: not started, or cannot reach the API)"
            case "absent":
                return self.message or "does not hold the bundle"
            case "failing" | "unreadable" | "stale":
                return f"{self.verdict}: {self.reason}: {self.message}"
            case _:
                left = (
                    f", {format_bytes(self.bytes_left)} left" if self.bytes_left is not None else ""
                )
                extra = f" ({self.message})" if self.message else ""
                return f"{self.state}{left}{extra}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"node": self.node, "verdict": self.verdict, "state": self.state}
        optional = {
            "reason": self.reason,
            "message": self.message,
            "bytesLeft": self.bytes_left,
            "imagesTotal": self.images_total,
        }
        return doc | {k: v for k, v in optional.items() if v not in (None, "")}


@dataclass(frozen=True, slots=True)
class Conflict:
    node: str
    images_total: int
    expected_total: int


@dataclass(frozen=True, slots=True)
class BundleView:
    bundle_id: str
    set_name: str | None
    nodes: tuple[NodeReport, ...]
    conflicts: tuple[Conflict, ...] = field(default=())
    """Image counts that differ, among nodes that publish no holdings (a hint)."""
    holders: tuple[Holder, ...] = field(default=())
    """Nodes whose published holdings list the bundle (complete or being fetched)."""
    digest_conflicts: tuple[DigestConflict, ...] = field(default=())
    """Nodes holding another manifest under the same id (exact, from the holdings)."""

    @property
    def pinned(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.is_pinned]

    @property
    def laggards(self) -> list[NodeReport]:
        return [n for n in self.nodes if not n.is_pinned]

    @property
    def holding(self) -> list[NodeReport]:
        complete = {h.node for h in self.holders if h.is_complete}
        return [n for n in self.nodes if n.is_holding or n.node in complete]

    @property
    def failing(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.verdict in ("failing", "unreadable")]

    @property
    def is_complete(self) -> bool:
        """Every Node in scope pinned, all with the same manifest; never true for an empty
        scope (a gate never opens on nothing)."""
        return bool(self.nodes) and not self.laggards and not self.digest_conflicts

    def bytes_left(self) -> tuple[int, int]:
        """(bytes left on the nodes that report it, nodes in progress that do not)."""
        busy = [n for n in self.nodes if n.verdict == "progressing"]
        known = sum(n.bytes_left for n in busy if n.bytes_left is not None)
        return known, sum(1 for n in busy if n.bytes_left is None)

    def summary(self) -> str:
        what = f"bundle {self.bundle_id}" + (f" set {self.set_name}" if self.set_name else "")
        known, unknown = self.bytes_left()
        left = f", {format_bytes(known)} left" if known else ""
        left += f" ({unknown} nodes not reporting bytes)" if unknown else ""
        return (
            f"{what}: {len(self.pinned)}/{len(self.nodes)} nodes pinned, "
            f"{len(self.holding)} holding, {len(self.failing)} failing{left}"
        )

    def lines(self) -> list[str]:
        """The summary, who holds it, one line per node that is not pinned, the conflicts."""
        out = [self.summary()]
        for label, is_complete in (("held by", True), ("being fetched by", False)):
            names = [h.node for h in self.holders if h.is_complete == is_complete]
            out += [f"  {label}: {', '.join(names)}"] if names else []
        out += [f"  {n.node}: {n.why()}" for n in self.laggards]
        return out + self.conflict_lines()

    def conflict_lines(self) -> list[str]:
        out = [
            f"  {c.node}: holds manifest {c.manifest_digest} under this id where most nodes "
            f"hold {c.expected_digest}: a different manifest under the same id"
            for c in self.digest_conflicts
        ]
        return out + [
            f"  {c.node}: reports {c.images_total} images for this id where most nodes "
            f"report {c.expected_total}: a different manifest under the same id?"
            for c in self.conflicts
        ]

    def to_json(self) -> dict[str, Any]:
        known, unknown = self.bytes_left()
        return {
            "bundleId": self.bundle_id,
            "set": self.set_name,
            "complete": self.is_complete,
            "nodes": len(self.nodes),
            "pinned": [n.node for n in self.pinned],
            "holding": [n.node for n in self.holding],
            "failing": [n.to_json() for n in self.failing],
            "laggards": [n.to_json() for n in self.laggards],
            "bytesLeft": known,
            "nodesWithoutBytes": unknown,
            "conflicts": [
                {"node": c.node, "imagesTotal": c.images_total, "expectedTotal": c.expected_total}
                for c in self.conflicts
            ],
            "holders": [
                {"node": h.node, "manifestDigest": h.manifest_digest, "complete": h.is_complete}
                for h in self.holders
            ],
            "manifestConflicts": [
                {"node": c.node, "manifestDigest": c.manifest_digest, "expected": c.expected_digest}
                for c in self.digest_conflicts
            ],
        }
