"""Which Nodes the site view judges for a bundle (pure; decision 0026, amended).

``choose_scope`` is the rule of ``nodeagent site status | wait``:

* ``--selector`` given: the Nodes it matches (``""``: every Node).
* Otherwise the bundle's target, as the nodes that hold the bundle publish it in their
  NodeImageHoldings (each from its own verified copy of the signed ``bundle.json``): the
  Nodes the target's selector matches **and** of the bundle's architecture.
* No holder publishes a target yet (no node holds the bundle, or only older agents do):
  every Node, and the scope says the target is not known yet.
* Holders publish different targets for one id (two manifests under one id, or a node
  that lies): no default is guessed, not even the majority's: ``ConfigInvalid`` (exit 78)
  asks for ``--selector``.

A Node's architecture is its ``kubernetes.io/arch`` label, else its
``status.nodeInfo.architecture`` (docs/runtime-facts.md, "Node architecture"); a Node with
neither stays in scope: a gate counts a Node it cannot place as a laggard, never skips it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.cluster.holdings import HeldTarget, Holdings
from nodeagent.errors import ConfigInvalid
from nodeagent.selectors import Selector, parse_selector
from nodeagent.strict import clip, quoted

ARCH_LABEL: Final = "kubernetes.io/arch"
_SHOWN_TARGETS: Final = 4
"""Different targets named in the refusal (each with one node that publishes it)."""


@dataclass(frozen=True, slots=True)
class Scope:
    nodes: tuple[str, ...]
    """The Nodes in scope, sorted."""
    description: str
    """For the output: which scope was used and why (already clipped)."""
    target: HeldTarget | None = None
    """The bundle's target when it chose the scope."""


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(node: Mapping[str, Any]) -> str:
    name = _dict(node.get("metadata")).get("name")
    return clip(name, 253) if isinstance(name, str) else ""


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    labels = _dict(_dict(node.get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}


def node_architecture(node: Mapping[str, Any]) -> str:
    """The Node's architecture: its ``kubernetes.io/arch`` label, else what its kubelet
    reports in ``status.nodeInfo``; ``""`` when neither says."""
    label = _labels(node).get(ARCH_LABEL, "")
    if label:
        return label
    reported = _dict(_dict(node.get("status")).get("nodeInfo")).get("architecture")
    return reported if isinstance(reported, str) else ""


def published_targets(holdings: Mapping[str, Holdings], bundle_id: str) -> dict[str, HeldTarget]:
    """Node → the target it publishes for ``bundle_id`` (holders that publish none left out)."""
    found = {}
    for node, held in holdings.items():
        bundle = held.bundle(bundle_id)
        if bundle is not None and bundle.target is not None:
            found[node] = bundle.target
    return found


def describe(target: HeldTarget) -> str:
    arch = clip(target.architecture, 40)
    if not target.node_selector:
        return f"every {arch} Node"
    return f"{arch} Nodes matching {quoted(target.node_selector, 200)}"


def _in_target(node: Mapping[str, Any], target: HeldTarget, selector: Selector) -> bool:
    arch = node_architecture(node)
    return selector.matches(_labels(node)) and arch in ("", target.architecture)


def _names(nodes: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(sorted({_name(n) for n in nodes} - {""}))


def choose_scope(
    nodes: Iterable[Mapping[str, Any]],
    holdings: Mapping[str, Holdings],
    bundle_id: str | None,
    selector_text: str | None,
) -> Scope:
    """The scope for ``bundle_id`` (None: every bundle, the selector or every Node);
    ``selector_text`` None: not given. Raises ``ConfigInvalid`` on a bad selector or when
    the holders publish different targets."""
    every = list(nodes)
    if selector_text:
        selector = parse_selector(selector_text)
        chosen = _names(n for n in every if selector.matches(_labels(n)))
        return Scope(chosen, f"scope: Nodes matching {quoted(selector_text, 200)} (--selector)")
    if selector_text is not None or bundle_id is None:
        return Scope(_names(every), "scope: every Node")
    targets = published_targets(holdings, bundle_id)
    distinct = sorted(set(targets.values()), key=lambda t: (t.architecture, t.node_selector))
    if not distinct:
        return Scope(
            _names(every),
            "scope: every Node; the bundle's target is not known until a node holds it",
        )
    if len(distinct) > 1:
        raise _conflict(bundle_id, targets, distinct)
    target = distinct[0]
    selector = parse_selector(target.node_selector)
    chosen = _names(n for n in every if _in_target(n, target, selector))
    holders = len(targets)
    who = "1 node that holds it" if holders == 1 else f"{holders} nodes that hold it"
    return Scope(
        chosen, f"scope: the bundle's target, {describe(target)} (published by {who})", target
    )


def _conflict(
    bundle_id: str, targets: Mapping[str, HeldTarget], distinct: list[HeldTarget]
) -> ConfigInvalid:
    shown = []
    for target in distinct[:_SHOWN_TARGETS]:
        who = sorted(n for n, t in targets.items() if t == target)
        more = f" and {len(who) - 1} more" if len(who) > 1 else ""
        shown.append(f"{clip(who[0], 253)}{more}: {describe(target)}")
    return ConfigInvalid(
        f"bundle {clip(bundle_id, 128)}: the nodes that hold it publish {len(distinct)} "
        f"different targets ({'; '.join(shown)}), so no default scope is chosen (a different "
        "manifest under the same id, or a node that is not telling the truth: see `nodeagent "
        "site status`); pass --selector to name the Nodes to judge"
    )
