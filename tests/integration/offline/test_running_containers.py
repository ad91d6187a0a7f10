"""check-offline's running-container check against containers CRI-O really runs
(tests/testenv/pods.py: pinns from CRI-O's source, Debian's runc, a static sleeper image):
a container whose image a pin covers is fine, one whose image none covers is
``ContainerImageNotPinned``, named with its pod, and pinning it clears the finding.
``ContainerImageMissing`` stays tested on the pure check (tests/unit/offline): CRI-O refuses
to remove an image a container uses, which this test asserts too."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.errors import RuntimeCallFailed
from nodeagent.offline import findings as f
from tests.integration.offline.test_runtime_facts import (
    ACCEPT_ALL,
    SAFE_KUBELET,
    check,
    node_config,
    pin,
    write,
)
from tests.testenv import pods
from tests.testenv.agent import pinned_image_set_yaml
from tests.testenv.crio import Crio
from tests.testenv.images import push
from tests.testenv.registry import Registry

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs("pods"),
]

CONTAINER_REASONS = {f.CONTAINER_IMAGE_MISSING, f.CONTAINER_IMAGE_NOT_PINNED}


async def test_running_containers_whose_image_no_pin_covers(
    tmp_path: Path, registry: Registry
) -> None:
    images = {
        name: pods.sleeper_image(tmp_path / name, f"nodeagent-test/{name}", label=name)
        for name in ("pause", "pinned", "loose")
    }
    refs = {
        name: push(registry.url, built.repository, built).reference(registry.host)
        for name, built in images.items()
    }
    runtime = pods.PodRuntime(pause_image=refs["pause"])
    with Crio(tmp_path / "crio", insecure_registries=[registry.host], pods=runtime) as crio:
        config = node_config(tmp_path, crio)
        write(config.offline.kubelet_config_files[0], SAFE_KUBELET)
        write(config.offline.signature_policy, ACCEPT_ALL)
        spec = pinned_image_set_yaml("apps", [refs["pinned"]])
        write(config.specs_persistent_dir / "apps.yaml", spec)
        async with CriClient(crio.endpoint, timeout_s=120) as cri:
            for ref in refs.values():
                await cri.pull_image(ref, timeout_s=120)
            pin(crio, [refs["pinned"]], pause=refs["pause"])
            async with pods.Pods(crio.endpoint) as running:
                await running.run(refs["pinned"], pod="web", namespace="shop")
                await running.run(refs["loose"], pod="batch", namespace="jobs")
                listed = await cri.list_containers()
                assert sorted((c.pod_namespace, c.pod_name) for c in listed) == [
                    ("jobs", "batch"),
                    ("shop", "web"),
                ]

                report = await check(config, cri)
                found = [x for x in report.findings if x.reason in CONTAINER_REASONS]
                assert [(x.reason, x.subject) for x in found] == [
                    (f.CONTAINER_IMAGE_NOT_PINNED, refs["loose"])
                ]
                assert "pod jobs/batch" in found[0].message

                # ContainerImageMissing cannot be made through CRI: CRI-O keeps an image a
                # container uses (it is lost only with the runtime's storage, containers too)
                with pytest.raises(RuntimeCallFailed, match="in use by a container"):
                    await cri.remove_image(refs["loose"])
                pin(crio, [refs["pinned"], refs["loose"]], pause=refs["pause"])
                report = await check(config, cri)
                assert not [x for x in report.findings if x.reason in CONTAINER_REASONS]
