"""The node's name by the kubelet's sources, first usable one wins."""

from __future__ import annotations

import pytest

from nodeagent.cluster.identity import (
    NodeName,
    choose_node_name,
    name_from_common_name,
    override_from_env,
)

FQDN = "worker-0.ocp.example.com"


@pytest.mark.parametrize(
    ("common_name", "expected"),
    [
        (f"system:node:{FQDN}", FQDN),
        ("system:node:ip-10-0-1-2.ec2.internal", "ip-10-0-1-2.ec2.internal"),
        ("system:node:", None),
        ("system:node:Worker-0", None),  # not lower case: not a Node name
        ("system:node:a..b", None),
        ("system:node:-a", None),
        ("system:node:" + "a" * 254, None),
        ("system:node:a b", None),
        ("system:admin", None),
        (f"node:{FQDN}", None),
        (f"x-system:node:{FQDN}", None),
    ],
)
def test_certificate_cn_must_be_system_node_and_a_dns_name(
    common_name: str, expected: str | None
) -> None:
    assert name_from_common_name(common_name) == expected


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        ([f"KUBELET_NODE_NAME={FQDN}\n"], FQDN),
        ([f'KUBELET_NODE_NAME="{FQDN}"\nKUBELET_PROVIDERID=aws:///x\n'], FQDN),
        ([f"  KUBELET_NODE_NAME = '{FQDN}'  \n"], FQDN),
        (["KUBELET_NODE_NAME=first\n", "KUBELET_NODE_NAME=second\n"], "second"),  # later file
        (["KUBELET_NODE_NAME=first\n", "OTHER=1\n"], "first"),
        (["KUBELET_NODE_NAME=\n"], None),  # empty: the kubelet uses the host name
        (["#KUBELET_NODE_NAME=commented\n"], None),
        (["KUBELET_NODE_NAMES=x\n"], None),
        ([], None),
    ],
)
def test_override_is_kubelet_node_name_as_systemd_passes_it(
    texts: list[str], expected: str | None
) -> None:
    assert override_from_env(texts) == expected


def test_configured_name_wins_over_everything() -> None:
    chosen = choose_node_name("configured-1", f"system:node:{FQDN}", "other", "host")
    assert chosen == NodeName("configured-1", "configured")


def test_certificate_then_override_then_full_host_name() -> None:
    assert choose_node_name("", f"system:node:{FQDN}", "override", "h").source == (
        "kubelet-certificate"
    )
    by_override = choose_node_name("", None, "override.example.com", "h")
    assert by_override.name == "override.example.com"
    assert by_override.source == "kubelet-override"
    assert by_override.skipped == ("no readable kubelet client certificate",)
    by_host = choose_node_name("", "system:admin", "Bad_Name", " Worker-0.OCP.example.com\n")
    assert by_host == NodeName(
        "worker-0.ocp.example.com",  # whole, not cut at the first dot, lower-cased
        "host-name",
        (
            "the kubelet certificate's CN is not system:node:<a DNS name>",
            "KUBELET_NODE_NAME is not a DNS name",
        ),
    )
    assert by_host.describe() == "node name worker-0.ocp.example.com from the host name"
