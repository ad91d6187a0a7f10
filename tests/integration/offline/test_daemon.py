"""The real daemon runs the drill: OfflineReady in its status file after the first sync,
and again after a change (a new set synced), with its journal line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pushed
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio

pytestmark = pytest.mark.integration


def offline(status: dict[str, Any]) -> dict[str, Any] | None:
    found = [c for c in status.get("conditions", []) if c["type"] == "OfflineReady"]
    return found[0] if found else None


def test_the_daemon_publishes_offline_ready_and_follows_changes(
    tmp_path: Path, fresh_crio: Crio, pushed: Pushed
) -> None:
    base = tmp_path / "agent"
    kubelet = base / "etc/kubernetes/kubelet.conf"
    manifests = base / "etc/kubernetes/manifests"
    policy = base / "etc/containers/policy.json"
    kubelet.parent.mkdir(parents=True)
    kubelet.write_text("kind: KubeletConfiguration\n")
    manifests.mkdir(parents=True)
    policy.parent.mkdir(parents=True)
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    extra = (
        f'[offline]\nkubelet_config_files = ["{kubelet}"]\nstatic_pod_dir = "{manifests}"\n'
        f'signature_policy = "{policy}"\n'
    )
    agent = Agent(base, fresh_crio, extra_config=extra)
    agent.write_set("apps", [pushed.ref(pushed.base_a)])
    with agent:
        # The drill runs at start (the image not pulled yet), then after the first sync.
        first = agent.wait_status(
            lambda s: (
                (c := offline(s)) is not None
                and "StoreLacksImage" in c["message"]
                and "PinnedImageMissing" not in c["message"]
            ),
            what="OfflineReady after the first sync",
        )
        condition = offline(first)
        assert condition is not None and condition["status"] == "False"
        assert "PodPullsAlways" not in condition["message"]
        (manifests / "web.yaml").write_text(
            "kind: Pod\nmetadata: {name: web, namespace: kube-system}\n"
            "spec: {containers: [{name: web, image: quay.example.com/web}]}\n"
        )
        agent.write_set("more", [pushed.ref(pushed.base_b)])  # a change: a sync, then the drill
        agent.wait_status(
            lambda s: (c := offline(s)) is not None and "PodPullsAlways" in c["message"],
            what="OfflineReady after the change",
        )
        agent.wait_log("offline_not_ready")
