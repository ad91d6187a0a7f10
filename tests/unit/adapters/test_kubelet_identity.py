"""Reading the kubelet's identity from real files: a certificate made like the kubelet's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import structlog

from nodeagent.adapters.kubelet_identity import (
    MAX_CERT_FILE_BYTES,
    certificate_common_name,
    identify_node,
    with_node_name,
)
from nodeagent.config import ClusterSettings, Config
from tests.testenv.pki import Authority

FQDN = "worker-0.ocp.example.com"


def config_for(tmp_path: Path, **cluster: object) -> Config:
    settings = ClusterSettings(
        enabled=True,
        kubelet_client_cert=tmp_path / "kubelet-client-current.pem",
        kubelet_env_files=(tmp_path / "kubelet-env", tmp_path / "node.env"),
    )
    settings = dataclasses.replace(settings, **cluster)  # type: ignore[arg-type]
    return dataclasses.replace(Config.default(root=tmp_path), cluster=settings)


def test_the_certificate_cn_is_read_from_the_kubelets_combined_pem(tmp_path: Path) -> None:
    path = tmp_path / "kubelet-client-current.pem"
    Authority("kubelet-signer").client(FQDN).write_pair(path, path)
    assert certificate_common_name(path) == f"system:node:{FQDN}"


def test_a_missing_damaged_or_huge_file_gives_no_cn(tmp_path: Path) -> None:
    path = tmp_path / "cert.pem"
    assert certificate_common_name(path) is None
    path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert certificate_common_name(path) is None
    good = Authority("ca").client(FQDN).cert_pem
    path.write_bytes(good + b"#" * MAX_CERT_FILE_BYTES)
    assert certificate_common_name(path) is None


def test_identify_uses_the_certificate_first_and_logs_the_source(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    path = config.cluster.kubelet_client_cert
    Authority("ca").client(FQDN).write_pair(path, path)
    (tmp_path / "node.env").write_text("KUBELET_NODE_NAME=ip-10-0-1-2.ec2.internal\n")
    with structlog.testing.capture_logs() as logs:
        chosen = with_node_name(config, host_name="short")
    assert chosen.cluster.node_name == FQDN
    [entry] = [e for e in logs if e["event"] == "node_name_chosen"]
    assert entry["source"] == "kubelet-certificate"
    assert entry["note"] == f"node name {FQDN} from the kubelet's client certificate"


def test_without_certificate_the_override_then_the_host_name(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    (tmp_path / "kubelet-env").write_text("KUBELET_NODE_NAME=from-kubelet-env\n")
    (tmp_path / "node.env").write_text('KUBELET_NODE_NAME="ip-10-0-1-2.ec2.internal"\n')
    chosen = identify_node(config, host_name="Host.Example.COM")
    assert (chosen.name, chosen.source) == ("ip-10-0-1-2.ec2.internal", "kubelet-override")
    (tmp_path / "node.env").unlink()
    (tmp_path / "kubelet-env").unlink()
    chosen = identify_node(config, host_name="Host.Example.COM")
    assert (chosen.name, chosen.source) == ("host.example.com", "host-name")


def test_a_configured_name_reads_nothing(tmp_path: Path) -> None:
    config = config_for(tmp_path, node_name="configured-0")
    path = config.cluster.kubelet_client_cert
    Authority("ca").client(FQDN).write_pair(path, path)
    assert with_node_name(config, host_name="h").cluster.node_name == "configured-0"
