"""``SignaturePublisher``: a release's signatures applied, or a line saying how to."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from nodeagent.bundles.release_signatures import SignaturePublisher, is_due
from nodeagent.errors import ApiAccessDenied, BundleDigestMismatch, NodeAgentError
from nodeagent.status import BundleReport

BODY: dict[str, Any] = {
    "metadata": {"name": "sha256-aa", "namespace": "openshift-config-managed"},
    "binaryData": {"sha256-aa-1": "c2ln"},
}


class Source:
    def __init__(self, error: NodeAgentError | None = None) -> None:
        self.error = error

    def config_map(self, bundle_id: str) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return BODY


class Applier:
    def __init__(self, error: NodeAgentError | None = None) -> None:
        self.error, self.applied = error, list[dict[str, Any]]()

    async def apply_config_map(self, body: dict[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        self.applied.append(body)


async def test_applied_when_the_api_allows_it() -> None:
    applier = Applier()
    with structlog.testing.capture_logs() as logs:
        assert await SignaturePublisher(Source(), applier).publish("b1")
    assert applier.applied == [BODY]
    assert [e["event"] for e in logs] == ["release_signatures_applied"]


@pytest.mark.parametrize(
    ("source", "applier", "reason"),
    [
        (Source(), None, "NoClusterApi"),
        (Source(), Applier(ApiAccessDenied("forbidden")), "ApiAccessDenied"),
        (Source(BundleDigestMismatch("changed")), Applier(), "BundleDigestMismatch"),
    ],
)
async def test_otherwise_the_journal_says_how_to_apply_them_by_hand(
    source: Source, applier: Applier | None, reason: str
) -> None:
    with structlog.testing.capture_logs() as logs:
        assert not await SignaturePublisher(source, applier).publish("b1")
    (entry,) = logs
    assert (entry["event"], entry["reason"]) == ("release_signatures_not_applied", reason)
    assert "nodeagent bundle release-signatures b1 --output signatures.yaml" in entry["action"]
    assert "oc apply -f signatures.yaml" in entry["action"]


def test_only_a_release_bundle_just_imported_is_due() -> None:
    steps = ("oc adm upgrade ...",)
    assert is_due(BundleReport("/m", "imported", "b1", next_steps=steps))
    assert not is_due(BundleReport("/m", "imported", "b1"))
    assert not is_due(BundleReport("/m", "verified", "b1", next_steps=steps))
    again = BundleReport("/m", "imported", "b1", next_steps=steps, is_already_imported=True)
    assert not is_due(again)
