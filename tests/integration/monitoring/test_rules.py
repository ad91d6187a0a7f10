"""deploy/monitoring's PrometheusRule through Prometheus' own promtool (Debian's ``prometheus``).

``promtool check rules`` takes a rule file, which is the PrometheusRule's ``spec``: it is
extracted first. ``promtool test rules`` then replays series against the alerts: each fires
when it should and stays silent otherwise (an unknown offline state is no alert).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testenv.packages import PACKAGES, ensure_packages

pytestmark = pytest.mark.integration

RULE = Path(__file__).resolve().parents[3] / "deploy" / "monitoring" / "prometheusrule.yaml"
PROMTOOL = PACKAGES["prometheus"]
NODE = {"instance": "worker-0", "job": "nodeagent-metrics"}


def rule_file(tmp_path: Path) -> Path:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    path = tmp_path / "nodeagent.rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in ({**NODE, **labels}).items())
    return {"series": f"{name}{{{text}}}", "values": values}


def alert(name: str, at: str, fired: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": fired}


def fired(name: str, labels: dict[str, str], value: str = "") -> dict[str, Any]:
    """The alert ``name`` with ``labels``, its annotations filled in as Prometheus would."""
    every = {**NODE, **labels}
    rule = next(r for g in yaml.safe_load(RULE.read_text())["spec"]["groups"]
                for r in g["rules"] if r["alert"] == name)  # fmt: skip
    annotations = {
        key: re.sub(
            r"\{\{ \$(labels\.(\w+)|value) \}\}",
            lambda m: every[m.group(2)] if m.group(2) else value,
            text,
        )
        for key, text in rule["annotations"].items()
    }
    return {"exp_labels": {**every, "severity": rule["labels"]["severity"]},
            "exp_annotations": annotations}  # fmt: skip


UNIT_TESTS: dict[str, Any] = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # set "apps": 1 of 3 pinned for 40 minutes, then all 3.
                series("nodeagent_set_images_wanted", "3x60", set="apps"),
                series("nodeagent_set_images_pinned", "1x40 3x20", set="apps"),
                # set "base": always pinned.
                series("nodeagent_set_images_wanted", "2x60", set="base"),
                series("nodeagent_set_images_pinned", "2x60", set="base"),
                # disk admission refuses one set from minute 5 to minute 20.
                series("nodeagent_disk_refused_sets", "0x4 1x15 0x40"),
                # a bundle refused at minute 20 (its series appears then, at 1).
                series(
                    "nodeagent_bundles_total",
                    "_x19 1x40",
                    outcome="rejected",
                    reason="BundleSignedByUnknownKey",
                ),
                series(
                    "nodeagent_bundles_total", "0x10 1x49", outcome="imported", reason="Imported"
                ),
                # the offline drill: unknown (absent) at first, then not ready from minute 10.
                series("nodeagent_offline_ready", "_x9 0x50"),
            ],
            "alert_rule_test": [
                alert("NodeAgentSetNotPinned", "29m", []),
                alert(
                    "NodeAgentSetNotPinned",
                    "35m",
                    [fired("NodeAgentSetNotPinned", {"set": "apps"}, value="1")],
                ),
                alert("NodeAgentSetNotPinned", "45m", []),
                alert("NodeAgentDiskAdmissionRefused", "13m", []),
                alert(
                    "NodeAgentDiskAdmissionRefused",
                    "17m",
                    [fired("NodeAgentDiskAdmissionRefused", {}, value="1")],
                ),
                alert("NodeAgentDiskAdmissionRefused", "25m", []),
                alert("NodeAgentBundleRefused", "15m", []),
                alert(
                    "NodeAgentBundleRefused",
                    "25m",
                    [
                        fired(
                            "NodeAgentBundleRefused",
                            {
                                "outcome": "rejected",
                                "reason": "BundleSignedByUnknownKey",
                            },
                        )
                    ],
                ),
                alert("NodeAgentBundleRefused", "55m", []),
                alert("NodeAgentNotOfflineReady", "8m", []),  # unknown is no alert
                alert("NodeAgentNotOfflineReady", "45m", [fired("NodeAgentNotOfflineReady", {})]),
            ],
        }
    ],
}


OLD, NEW, NEXT = ("sha256:" + c * 64 for c in "abc")
WORKERS = ("worker-0", "worker-1", "worker-2")


def on(node: str, name: str, values: str, **labels: str) -> dict[str, str]:
    return series(name, values, **labels) | {
        "series": series(name, values, **labels)["series"].replace("worker-0", node)
    }


def release_alert(labels: dict[str, str], nodes: str) -> dict[str, Any]:
    digest, version = labels["digest"], labels["version"]
    return {
        "exp_labels": labels | {"severity": "warning", "openShiftUpdatePrecheck": "true"},
        "exp_annotations": {
            "summary": f"OpenShift release {version} is not pinned on every node.",
            "description": f"Release {digest} ({version}), which the cluster is asked to move "
            "to or which a stick brought as its next version, is not pinned on: "
            f"{nodes}for 10 minutes. Those nodes would pull it from a registry during the "
            "upgrade.",
            "runbook_url": RUNBOOK + "#nodeagentreleasenotpinned",
        },
    }


RUNBOOK = "file:///usr/share/doc/nodeagent/alerts.md"
TARGET = {"digest": NEW, "version": "4.16.5"}
CARRIED = {"digest": NEXT, "version": "4.16.6"}
RELEASE_TESTS: dict[str, Any] = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                *(on(n, "up", "1x40") for n in WORKERS),
                # ClusterVersion asks for 4.16.5: every node exports the target it read.
                *(on(n, "nodeagent_release_target", "1x40", **TARGET) for n in WORKERS),
                # worker-0 and -1 pinned it; worker-2 holds it unpinned until minute 25.
                *(
                    on(n, "nodeagent_release_pinned", "1x40", **TARGET, upgrade="true")
                    for n in WORKERS[:2]
                ),
                on("worker-2", "nodeagent_release_pinned", "0x24 1x15", **TARGET, upgrade="true"),
                # 4.16.6 came on a stick to worker-0 only (the others export nothing of it).
                on("worker-0", "nodeagent_release_pinned", "1x40", **CARRIED, upgrade="true"),
                # the old release, pinned on worker-0 alone: not an upgrade, no alert.
                on(
                    "worker-0",
                    "nodeagent_release_pinned",
                    "1x40",
                    digest=OLD,
                    version="4.16.3",
                    upgrade="false",
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "NodeAgentReleaseNotPinned", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "NodeAgentReleaseNotPinned",
                    "exp_alerts": [
                        release_alert({**NODE, "instance": "worker-2", **TARGET}, "worker-2 "),
                        release_alert(CARRIED, "worker-1 worker-2 "),
                    ],
                },
                {
                    "eval_time": "35m",
                    "alertname": "NodeAgentReleaseNotPinned",
                    "exp_alerts": [release_alert(CARRIED, "worker-1 worker-2 ")],
                },
            ],
        }
    ],
}


@pytest.fixture(scope="module")
def promtool() -> str:
    ensure_packages({"prometheus": PROMTOOL})
    return PROMTOOL


def test_promtool_checks_the_rules(promtool: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


@pytest.mark.parametrize("tests", [UNIT_TESTS, RELEASE_TESTS], ids=["node", "release"])
def test_the_alerts_fire_when_they_should_and_only_then(
    promtool: str, tmp_path: Path, tests: dict[str, Any]
) -> None:
    rules = rule_file(tmp_path)
    unit = tmp_path / "nodeagent.rules.test.yaml"
    unit.write_text(yaml.safe_dump({"rule_files": [rules.name], **tests}))
    result = subprocess.run(
        [promtool, "test", "rules", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
