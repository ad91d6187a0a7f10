"""``check-config`` opens the files the configuration names, as the daemon will: it said
"config: ok" with a garbage trusted key, and with cluster or site mode on while the
kubeconfig or the certificates were missing (issue 28)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from nodeagent.bundles import minisign
from nodeagent.cli import main as cli
from tests.testenv.site_pki import issue_node_cert, make_ca, write_ca, write_pem_bundle
from tests.unit.cli import schemas


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def configure(root: Path, text: str = "") -> Path:
    (root / "etc/nodeagent").mkdir(parents=True, exist_ok=True)
    (root / "etc/nodeagent/config.toml").write_text(text)
    keys = root / "etc/nodeagent/trusted-keys.d"
    keys.mkdir(parents=True, exist_ok=True)
    return keys


def check(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["check-config", "--root", str(root)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trusted_keys_are_counted_and_none_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = configure(tmp_path)
    code, out, _ = check(tmp_path, capsys)
    assert code == 0 and "trusted keys: 0" in out and "every bundle would be refused" in out
    for name in ("factory", "site"):
        public, _secret = minisign.generate_keypair(comment=name)
        (keys / f"{name}.pub").write_text(public)
    code, out, _ = check(tmp_path, capsys)
    assert code == 0 and "config: ok" in out and "trusted keys: 2" in out


def test_a_garbage_trusted_key_is_not_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = configure(tmp_path)
    (keys / "factory.pub").write_text("untrusted comment: x\nnot base64 at all\n")
    code, out, err = check(tmp_path, capsys)
    assert code != 0 and "config: NOT usable" in out
    assert "error: SigningKeyMalformed: " in err and "factory" in err


def test_cluster_mode_without_a_kubeconfig_is_not_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(tmp_path, '[cluster]\nenabled = true\nkubeconfig = "/var/lib/kubelet/kubeconfig"\n')
    code, _, err = check(tmp_path, capsys)
    assert code == 78 and "error: KubeconfigInvalid: " in err and "kubeconfig" in err


def test_site_roles_need_their_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = '[site]\nserve = true\npeers = ["198.51.100.7:9447"]\n'
    configure(tmp_path, site)
    code, _, err = check(tmp_path, capsys)
    assert code == 78 and err.count("error: SiteCertificatesInvalid: ") == 2  # serve and fetch
    ca = make_ca("site CA")
    pem = issue_node_cert(ca, "node-1", ["198.51.100.8"])
    write_pem_bundle(tmp_path / "var/lib/kubelet/pki/kubelet-server-current.pem", pem)
    write_pem_bundle(tmp_path / "var/lib/kubelet/pki/kubelet-client-current.pem", pem)
    write_ca(tmp_path / "etc/kubernetes/kubelet-ca.crt", ca)
    code, _, err = check(tmp_path, capsys)
    assert code == 0, err
    other = issue_node_cert(make_ca("another CA"), "node-1", [])  # a key of another certificate
    (tmp_path / "var/lib/kubelet/pki/kubelet-server-current.pem").write_bytes(
        pem.cert_pem() + other.key_pem()
    )
    code, _, err = check(tmp_path, capsys)
    assert code == 78 and err.count("SiteCertificatesInvalid") == 1  # the peer server's only


def test_the_json_document_carries_the_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(tmp_path, "[cluster]\nenabled = true\n")
    code = cli.main(["check-config", "--json", "--root", str(tmp_path)])
    doc = schemas.check("check-config", capsys.readouterr().out)
    assert code == 78 and doc["trustedKeys"] == 0
    # cluster mode finds peers, so "follow = auto" fetches: the client certificate too
    reasons = [p["reason"] for p in doc["referencedFiles"]]
    assert reasons == ["KubeconfigInvalid", "SiteCertificatesInvalid"]
    assert json.dumps(doc["notes"]).count("every bundle would be refused") == 1
