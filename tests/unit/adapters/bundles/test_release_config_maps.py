"""``adapters.bundles.release.ConfigMaps``: create, or add to the ConfigMap another node made.

The same adapter runs against the real API server and the admission policy in
tests/security/test_node_configmaps.py; here, which request follows which answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.adapters.bundles.release import ConfigMaps
from nodeagent.cluster.kinds import CONFIG_MAP, ResourceKind
from nodeagent.errors import ApiAccessDenied, ApiRequestRejected, NodeAgentError

BODY: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "sha256-" + "a" * 64,
        "namespace": "openshift-config-managed",
        "labels": {"release.openshift.io/verification-signatures": ""},
        "annotations": {"nodeagent.openshift.io/bundle": "b1"},
    },
    "binaryData": {"sha256-" + "a" * 64 + "-1": "c2lnbmVk"},
}


class Api:
    def __init__(self, create_error: NodeAgentError | None) -> None:
        self.create_error = create_error
        self.calls: list[tuple[str, Any]] = []

    async def create(self, kind: ResourceKind, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", (kind, body)))
        if self.create_error is not None:
            raise self.create_error
        return body

    async def merge_patch(
        self, kind: ResourceKind, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        self.calls.append(("merge_patch", (kind, name, patch, namespace)))
        return patch


async def test_a_new_config_map_is_created_and_nothing_else() -> None:
    api = Api(None)
    await ConfigMaps(api).apply_config_map(BODY)
    assert api.calls == [("create", (CONFIG_MAP, BODY))]


async def test_one_that_exists_gets_the_keys_added_by_a_merge_patch() -> None:
    api = Api(ApiRequestRejected("create ConfigMap x: HTTP 409: already exists"))
    await ConfigMaps(api).apply_config_map(BODY)
    name, namespace = BODY["metadata"]["name"], BODY["metadata"]["namespace"]
    (_, (kind, patched, patch, where)) = api.calls[1]
    assert (kind, patched, where) == (CONFIG_MAP, name, namespace)
    assert patch["binaryData"] == BODY["binaryData"]
    assert patch["metadata"]["labels"] == BODY["metadata"]["labels"]


@pytest.mark.parametrize(
    "error",
    [
        ApiRequestRejected("create ConfigMap x: HTTP 422: invalid"),
        ApiAccessDenied("create ConfigMap x: HTTP 403: denied"),
    ],
)
async def test_any_other_refusal_is_the_callers(error: NodeAgentError) -> None:
    api = Api(error)
    with pytest.raises(type(error)):
        await ConfigMaps(api).apply_config_map(BODY)
    assert [call for call, _ in api.calls] == ["create"]
