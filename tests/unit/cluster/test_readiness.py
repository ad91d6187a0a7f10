"""Registry pull terms from the Node object: Ready, DiskPressure, control-plane pace."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from nodeagent.cluster.readiness import PullGate, pull_terms
from nodeagent.ports import PullTerms


def node(
    labels: dict[str, str] | None = None, **conditions: str | tuple[str, str]
) -> dict[str, Any]:
    items = []
    for kind, value in conditions.items():
        status, reason = value if isinstance(value, tuple) else (value, "")
        items.append({"type": kind, "status": status, "reason": reason})
    return {
        "metadata": {"name": "n1.example.com", "labels": labels or {}},
        "status": {"conditions": items},
    }


MASTER = {"node-role.kubernetes.io/master": ""}
CONTROL_PLANE = {"node-role.kubernetes.io/control-plane": ""}
WORKER = {"node-role.kubernetes.io/worker": ""}


@pytest.mark.parametrize(
    ("obj", "reason", "one_at_a_time"),
    [
        (node(WORKER, Ready="True", DiskPressure="False"), "", False),
        (node(WORKER, Ready=("False", "KubeletNotReady")), "NodeNotReady", False),
        (node(WORKER, Ready=("Unknown", "NodeStatusUnknown")), "NodeNotReady", False),
        (node(WORKER, Ready="True", DiskPressure="True"), "NodeDiskPressure", False),
        (node(WORKER, Ready="False", DiskPressure="True"), "NodeNotReady", False),
        (node(WORKER), "", False),  # the kubelet never reported: nothing known to be wrong
        (node(MASTER, Ready="True"), "", True),
        (node(CONTROL_PLANE, Ready="True"), "", True),
        (node({**MASTER, **WORKER}, Ready="False"), "NodeNotReady", True),
        ({"metadata": {"name": "x"}, "status": {"conditions": "garbage"}}, "", False),
    ],
)
def test_pull_terms(obj: dict[str, Any], reason: str, one_at_a_time: bool) -> None:
    terms = pull_terms(obj, 1.0)
    assert terms.held_reason == reason
    assert terms.one_at_a_time is one_at_a_time
    assert terms.pause_s == (1.0 if one_at_a_time else 0.0)


def test_the_message_says_what_waits_and_what_does_not() -> None:
    terms = pull_terms(node(WORKER, Ready=("False", "KubeletNotReady")), 1.0)
    assert terms.held_message.startswith("the Node n1.example.com is not Ready (Ready=False")
    assert "restored from the node's store" in terms.held_message


def test_gate_logs_each_transition_once_and_wakes_the_follower() -> None:
    gate = PullGate(2.0)
    assert gate.current() == PullTerms()
    with structlog.testing.capture_logs() as logs:
        gate.observe(node(WORKER, Ready="True"))
        assert not gate.changed.is_set()  # same terms as before the Node was known
        gate.observe(node(WORKER, Ready="False"))
        gate.observe(node(WORKER, Ready="False"))
        gate.observe(node(WORKER, Ready="True"))
        gate.observe(node(MASTER, Ready="True"))
    events = [(e["event"], e.get("reason") or e.get("previous_reason")) for e in logs]
    assert events == [
        ("registry_pulls_held", "NodeNotReady"),
        ("registry_pulls_resumed", "NodeNotReady"),
        ("registry_pull_pace", None),
    ]
    assert gate.changed.is_set()
    assert gate.current() == PullTerms(one_at_a_time=True, pause_s=2.0)
