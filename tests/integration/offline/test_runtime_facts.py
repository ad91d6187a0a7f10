"""``nodeagent check-offline`` against a real CRI-O: each runtime and file finding made, seen,
and gone once fixed (pinned sets, pause image, store, kubelet policy, signature policy,
static pods), through the command line's own entry point."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.offline import HostFacts
from nodeagent.cli.main import main
from nodeagent.config import Config, OfflineSettings, RuntimeSettings
from nodeagent.offline import findings as f
from nodeagent.offline.checks import run_checks
from nodeagent.offline.findings import OfflineReport
from tests.conftest import Pushed
from tests.testenv.agent import pinned_image_set_yaml
from tests.testenv.crio import Crio

pytestmark = pytest.mark.integration

SAFE_KUBELET = "kind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: NeverVerify\n"
ACCEPT_ALL = json.dumps({"default": [{"type": "insecureAcceptAnything"}]})


def node_config(tmp_path: Path, crio: Crio) -> Config:
    base = Config.default(root=tmp_path)
    runtime = RuntimeSettings(
        endpoint=crio.endpoint,
        config_file=crio.config_file,
        config_dir=crio.dropin_dir,
        transient_dropin_dir=tmp_path / "run/crio/crio.conf.d",
    )
    offline = OfflineSettings(
        kubelet_config_files=(tmp_path / "etc/kubernetes/kubelet.conf",),
        static_pod_dir=tmp_path / "etc/kubernetes/manifests",
        signature_policy=tmp_path / "etc/containers/policy.json",
    )
    return dataclasses.replace(base, runtime=runtime, offline=offline)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def check(config: Config, cri: CriClient) -> OfflineReport:
    return run_checks(await HostFacts(config, cri).gather())


def found(report: OfflineReport) -> set[tuple[str, str]]:
    return {(item.reason, item.subject) for item in report.findings}


def pin(crio: Crio, refs: list[str], *, pause: str | None = None) -> None:
    text = "[crio.image]\npinned_images = " + json.dumps(refs) + "\n"
    if pause is not None:
        text += f"pause_image = {json.dumps(pause)}\n"
    write(crio.dropin_dir / "50-test.conf", text)
    crio.reload()


async def test_runtime_findings_made_and_fixed(
    tmp_path: Path, fresh_crio: Crio, cri: CriClient, pushed: Pushed
) -> None:
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    config = node_config(tmp_path, fresh_crio)
    write(config.specs_persistent_dir / "apps.yaml", pinned_image_set_yaml("apps", [a, b]))
    write(config.offline.kubelet_config_files[0], SAFE_KUBELET)
    write(config.offline.signature_policy, ACCEPT_ALL)

    report = await check(config, cri)  # nothing pulled yet
    assert {
        (f.PINNED_IMAGE_MISSING, a),
        (f.PINNED_IMAGE_MISSING, b),
        (f.PAUSE_IMAGE_MISSING, "localhost/nodeagent-test/pause:none"),
        (f.STORE_LACKS_IMAGE, a),
        (f.STORE_LACKS_IMAGE, b),
    } == found(report)

    await cri.pull_image(a, timeout_s=120)
    await cri.pull_image(b, timeout_s=120)
    report = await check(config, cri)  # present, not pinned by CRI-O
    assert (f.PINNED_IMAGE_NOT_PINNED, a) in found(report)
    assert (f.PINNED_IMAGE_NOT_PINNED, b) in found(report)

    pin(fresh_crio, [a, b], pause=a)  # CRI-O pins both, and a is its pause image
    report = await check(config, cri)
    assert {reason for reason, _ in found(report)} == {f.STORE_LACKS_IMAGE}
    assert await cri.list_containers() == []  # the wire works; this runtime runs no pods


async def test_file_findings_through_the_command_line(
    tmp_path: Path,
    fresh_crio: Crio,
    cri: CriClient,
    pushed: Pushed,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = pushed.ref(pushed.base_a)
    config = node_config(tmp_path, fresh_crio)
    await cri.pull_image(a, timeout_s=120)
    pin(fresh_crio, [a], pause=a)
    write(config.specs_persistent_dir / "apps.yaml", pinned_image_set_yaml("apps", [a]))
    kubelet = config.offline.kubelet_config_files[0]
    policy = config.offline.signature_policy
    manifests = config.offline.static_pod_dir
    write(
        kubelet,
        "kind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: AlwaysVerify\n",
    )
    host = a.split("/")[0]
    write(
        policy,
        json.dumps(
            {
                "default": [{"type": "insecureAcceptAnything"}],
                "transports": {"docker": {host: [{"type": "sigstoreSigned", "keyPath": "/k.pub"}]}},
            }
        ),
    )
    write(
        manifests / "web.yaml",
        "kind: Pod\nmetadata: {name: web, namespace: kube-system}\n"
        "spec: {containers: [{name: web, image: quay.example.com/web}]}\n",
    )
    config_file = write_config(tmp_path, config)

    code = await asyncio.to_thread(main, ["--config", str(config_file), "check-offline", "--json"])
    doc = json.loads(capsys.readouterr().out)
    reasons = {item["reason"] for item in doc["findings"]}
    assert code == 1 and doc["offlineReady"] is False
    assert {
        f.KUBELET_VERIFIES_PRELOADED,
        f.SIGNATURES_REQUIRED,
        f.POD_PULLS_ALWAYS,
        f.POD_IMAGE_BY_TAG,
        f.STORE_LACKS_IMAGE,
    } == reasons

    write(kubelet, SAFE_KUBELET)
    write(policy, ACCEPT_ALL)
    (manifests / "web.yaml").unlink()
    write(kubelet.parent / "broken.yaml", "")  # not read: only the configured file is
    code = await asyncio.to_thread(main, ["--config", str(config_file), "check-offline"])
    out = capsys.readouterr().out
    assert code == 1 and "StoreLacksImage" in out and "what to do:" in out
    assert "KubeletVerifiesPreloadedImages" not in out


async def test_unknown_is_never_ready(tmp_path: Path, fresh_crio: Crio, cri: CriClient) -> None:
    """No kubelet configuration, an unreadable policy, the runtime stopped: each a finding."""
    config = node_config(tmp_path, fresh_crio)
    write(config.offline.signature_policy, '{"default": [], "default": []}')
    fresh_crio.stop()
    report = await check(config, cri)
    subjects = {item.subject for item in report.findings if item.reason == f.CHECK_INCOMPLETE}
    assert subjects == {
        "the runtime's images and containers",
        "the kubelet configuration",
        f"the signature policy {config.offline.signature_policy}",
    }
    assert not report.is_ready


def write_config(tmp_path: Path, config: Config) -> Path:
    """The settings of ``config`` that differ from the defaults, as a TOML file."""
    rt, off = config.runtime, config.offline
    lines: list[Any] = [
        "[runtime]",
        f'endpoint = "{rt.endpoint}"',
        f'config_file = "{rt.config_file}"',
        f'config_dir = "{rt.config_dir}"',
        f'transient_dropin_dir = "{rt.transient_dropin_dir}"',
        "[specs]",
        f'dirs = ["{config.specs_persistent_dir}"]',
        "[state]",
        f'dir = "{config.state.dir}"',
        "[offline]",
        f'kubelet_config_files = ["{off.kubelet_config_files[0]}"]',
        f'static_pod_dir = "{off.static_pod_dir}"',
        f'signature_policy = "{off.signature_policy}"',
    ]
    path = tmp_path / "nodeagent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
