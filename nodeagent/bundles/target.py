"""A bundle's target: which nodes a bundle is meant for (pure).

``bundle.json`` may carry ``"target": {"nodeSelector": "<kubectl -l selector>"}``
(format version 2, docs/bundle-format.md#target). The architecture half of a target is the
manifest's own ``architecture``: every bundle is made for one (its images are resolved for
it), so a second architecture field could only repeat it or contradict it
(docs/decisions/0028-bundle-targets.md).

``target_miss`` is the one rule both the stick importer and the site's follow rule
(``nodeagent.site.follow``) apply: a node is in the target when its architecture is the
bundle's and, when the bundle names a selector, the node's labels are known and match it.
Without labels (no Kubernetes API) a selector never matches: a node must never take a
bundle it cannot tell is meant for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from nodeagent.errors import BundleManifestInvalid, BundleNotInTarget, ConfigInvalid
from nodeagent.selectors import Selector, parse_selector
from nodeagent.strict import clip, quoted

FORMAT_VERSION: Final = 1
"""``bundle.json``'s version without a ``target``: every nodeagent that reads bundles takes it."""
TARGET_FORMAT_VERSION: Final = 2
"""The version of a bundle with a ``target``. A nodeagent that reads only version 1 ignores
fields it does not know, so it would take a bundle not meant for it; it refuses version 2
(``BundleFormatUnsupported``) instead (docs/decisions/0028-bundle-targets.md)."""
FRESHNESS_FORMAT_VERSION: Final = 3
"""Version 2 plus a signed ``sequence`` and an optional ``expires`` (``bundles.freshness``):
what ``bundle create`` writes. A reader of versions 1 and 2 would ignore them, and so take an
expired bundle or an older one after a newer; it refuses version 3 instead."""
TARGET_KEYS: Final = frozenset({"nodeSelector"})
MAX_SELECTOR_CHARS: Final = 4096
"""A selector's text in ``bundle.json``: 4 KiB holds about 50 requirements of the longest
label keys (316 characters) and values (63); parsing that many takes under a millisecond."""
MAX_REQUIREMENTS: Final = 64
"""Requirements in one selector (a conjunction); real targets have one to five."""

MAX_KEY_NAME_CHARS: Final = 63
MAX_KEY_PREFIX_CHARS: Final = 253
"""A label key's name and DNS prefix (Kubernetes' limits, docs/runtime-facts.md)."""

TargetPart = Literal["selector", "architecture"]
"""Which half of a target left a node out."""


@dataclass(frozen=True, slots=True, eq=False)
class BundleTarget:
    """The nodes a bundle is meant for, beyond its architecture. Two targets are equal when
    they select the same way (their canonical texts are equal), whatever their order."""

    node_selector: Selector

    @property
    def selector_text(self) -> str:
        """The canonical ``kubectl -l`` form: requirements sorted, each once."""
        return canonical_selector(self.node_selector)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BundleTarget):
            return NotImplemented
        return self.selector_text == other.selector_text

    def __hash__(self) -> int:
        return hash(self.selector_text)


def canonical_selector(selector: Selector) -> str:
    """``selector`` written the one way ``bundle create`` writes it ("" for everything)."""
    if not selector.requirements:
        return ""
    terms = {str(Selector((requirement,))) for requirement in selector.requirements}
    return ",".join(sorted(terms))


def parse_selector_text(text: str, where: str) -> Selector:
    """A target's selector: bounded, parsed, not empty. Raises ``BundleManifestInvalid``."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise BundleManifestInvalid(
            f"{where}: nodeSelector is {len(text)} characters, at most {MAX_SELECTOR_CHARS}"
        )
    try:
        selector = parse_selector(text)
    except ConfigInvalid as exc:
        raise BundleManifestInvalid(clip(f"{where}: nodeSelector: {exc.message}", 400)) from None
    if not selector.requirements:
        raise BundleManifestInvalid(
            f"{where}: nodeSelector is empty; a bundle for every node of its architecture "
            "carries no target"
        )
    if len(selector.requirements) > MAX_REQUIREMENTS:
        raise BundleManifestInvalid(
            f"{where}: nodeSelector has {len(selector.requirements)} requirements, "
            f"at most {MAX_REQUIREMENTS}"
        )
    for requirement in selector.requirements:
        prefix, _, name = requirement.key.rpartition("/")
        if len(name) > MAX_KEY_NAME_CHARS or len(prefix) > MAX_KEY_PREFIX_CHARS:
            raise BundleManifestInvalid(
                f"{where}: nodeSelector: {quoted(requirement.key, 80)} is not a label key (a "
                f"name of at most {MAX_KEY_NAME_CHARS} characters after an optional DNS "
                f"prefix of at most {MAX_KEY_PREFIX_CHARS})"
            )
    return selector


def parse_target(value: Any, where: str = "bundle.json target") -> BundleTarget:
    """The ``target`` object of ``bundle.json``; unknown keys are refused."""
    if not isinstance(value, dict):
        raise BundleManifestInvalid(f"{where} must be an object")
    unknown = sorted(set(value) - TARGET_KEYS)
    if unknown:
        raise BundleManifestInvalid(
            f"{where}: unknown key {quoted(unknown[0], 80)} (a target holds only nodeSelector; "
            "a newer nodeagent may have made this bundle)"
        )
    text = value.get("nodeSelector")
    if not isinstance(text, str):
        raise BundleManifestInvalid(f"{where}: nodeSelector must be a string (kubectl -l form)")
    return BundleTarget(parse_selector_text(text, where))


def target_of(doc: Mapping[str, Any]) -> BundleTarget | None:
    """``bundle.json``'s ``target`` (its ``formatVersion`` already checked to be known): only
    in version 2 or later, which a reader of version 1 refuses rather than ignore the target."""
    if "target" not in doc:
        return None
    if doc.get("formatVersion") == FORMAT_VERSION:
        raise BundleManifestInvalid(
            f"bundle.json: a target needs formatVersion {TARGET_FORMAT_VERSION} (a nodeagent "
            f"that reads only version {FORMAT_VERSION} would ignore it and take the bundle)"
        )
    return parse_target(doc["target"])


def target_doc(target: BundleTarget) -> dict[str, str]:
    """``target`` as ``bundle.json`` holds it."""
    return {"nodeSelector": target.selector_text}


def target_miss(
    architecture: str,
    target: BundleTarget | None,
    *,
    node_labels: Mapping[str, str] | None,
    node_architecture: str,
) -> TargetPart | None:
    """Which part of the target leaves this node out, or None when the node is in it.

    ``architecture`` is the bundle's; ``node_labels`` None means they are not known (no
    Kubernetes API, or not listed yet): then only a bundle without a selector matches.
    """
    if architecture != node_architecture:
        return "architecture"
    if target is None:
        return None
    if node_labels is None or not target.node_selector.matches(node_labels):
        return "selector"
    return None


def describe_target(architecture: str, target: BundleTarget | None) -> str:
    """``amd64 nodes matching 'node-role.kubernetes.io/worker'`` for a message or a terminal."""
    if target is None:
        return f"every {clip(architecture, 40)} node"
    return f"{clip(architecture, 40)} nodes matching {quoted(target.selector_text, 200)}"


def check_node_in_target(
    target: BundleTarget | None, node_labels: Mapping[str, str] | None, *, bundle_id: str
) -> None:
    """Refuse a bundle whose selector leaves this node out (the stick importer's rule; the
    architecture is rule R13's). Raises ``BundleNotInTarget`` saying what to do."""
    if target is None:
        return
    wanted = quoted(target.selector_text, 200)
    if node_labels is None:
        raise BundleNotInTarget(
            f"bundle {clip(bundle_id, 128)} is only for nodes matching {wanted}, and this "
            "node's labels are not known (no cluster mode, or the API server did not give "
            "them in time); if the bundle is meant for this node, import it with "
            "`nodeagent bundle import --ignore-target`"
        )
    if not target.node_selector.matches(node_labels):
        raise BundleNotInTarget(
            f"bundle {clip(bundle_id, 128)} is only for nodes matching {wanted}, and this "
            "node's labels do not match; use the bundle made for this node, or import it with "
            "`nodeagent bundle import --ignore-target` if it is meant for this node"
        )
