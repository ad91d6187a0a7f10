"""Giving a release bundle's signatures to the cluster-version operator, after an import.

The CVO verifies a release before it upgrades to it, from signatures it finds in ConfigMaps
of ``openshift-config-managed`` labelled ``release.openshift.io/verification-signatures``
(docs/runtime-facts.md#release-signatures). A node cannot write there with its own
identity; an administrator may allow it with the opt-in RBAC and admission policy in
deploy/opt-in/release-signatures.yaml (decision 0051: such a ConfigMap only, and only adding
keys). ``SignaturePublisher.publish`` writes the ConfigMap when there is an API (creates it,
or adds its keys to the one another node made), and when it cannot (no API, no RBAC, the
policy refused, another error) it says in the journal which command does it by hand.
Either way the import stands: the signatures are in the node store and ``nodeagent bundle
release-signatures`` writes them any time.

Ports: ``SignatureSource`` (``adapters.bundles.release``: reads and checks the bundle's
signature files in the node store) and ``ConfigMapApplier`` (``adapters.bundles.release.ConfigMaps``
over ``adapters.kube``).
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.status import BundleReport
from nodeagent.strict import clip

log = structlog.get_logger(__name__)


class SignatureSource(Protocol):
    def config_map(self, bundle_id: str) -> dict[str, Any]:
        """The ConfigMap of a stored release bundle's signatures, every byte checked."""
        ...


class ConfigMapApplier(Protocol):
    async def apply_config_map(self, body: dict[str, Any]) -> None: ...


def by_hand(bundle_id: str) -> str:
    return (
        f"nodeagent bundle release-signatures {bundle_id} --output signatures.yaml && "
        "oc apply -f signatures.yaml"
    )


def is_due(report: BundleReport) -> bool:
    """A release bundle just imported (not one imported before)."""
    return report.state == "imported" and bool(report.next_steps) and not report.is_already_imported


class SignaturePublisher:
    """Applies a release's signature ConfigMap, or says how to (see the module docstring)."""

    def __init__(
        self,
        source: SignatureSource,
        applier: ConfigMapApplier | None,
    ) -> None:
        self.source = source
        self.applier = applier

    async def publish(self, bundle_id: str) -> bool:
        """True when the ConfigMap was applied."""
        try:
            body = self.source.config_map(bundle_id)
        except NodeAgentError as exc:
            self._not_applied(bundle_id, exc.reason, exc.message)
            return False
        if not body["binaryData"]:
            return False
        if self.applier is None:
            self._not_applied(bundle_id, "NoClusterApi", "this node does not run in cluster mode")
            return False
        try:
            await self.applier.apply_config_map(body)
        except NodeAgentError as exc:
            self._not_applied(bundle_id, exc.reason, exc.message)
            return False
        log.info(
            "release_signatures_applied",
            bundle=bundle_id,
            config_map=f"{body['metadata']['namespace']}/{body['metadata']['name']}",
            signatures=len(body["binaryData"]),
        )
        return True

    def _not_applied(self, bundle_id: str, reason: str, message: str) -> None:
        log.warning(
            "release_signatures_not_applied",
            bundle=bundle_id,
            reason=reason,
            error=clip(message, 300),
            action=f"run by hand: {by_hand(bundle_id)}",
        )
