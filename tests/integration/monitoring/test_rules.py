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
    assert "SUCCESS: 6 rules found" in result.stdout


def test_the_alerts_fire_when_they_should_and_only_then(promtool: str, tmp_path: Path) -> None:
    rules = rule_file(tmp_path)
    unit = tmp_path / "nodeagent.rules.test.yaml"
    unit.write_text(yaml.safe_dump({"rule_files": [rules.name], **UNIT_TESTS}))
    result = subprocess.run(
        [promtool, "test", "rules", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
