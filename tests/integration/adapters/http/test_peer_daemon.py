"""The daemon starts the peer server when ``[site] serve = true``, and only then."""

from __future__ import annotations

import ssl
from pathlib import Path

from nodeagent.site.holdings import parse_holdings
from tests.integration.adapters.http.test_peer import fetch
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.pki import Authority
from tests.testenv.registry import free_port


def test_the_daemon_serves_its_store_to_peers_when_asked(tmp_path: Path, crio: Crio) -> None:
    ca = Authority("site CA")
    pki = tmp_path / "pki"
    pki.mkdir()
    ca.serving("node-0").write_pair(pki / "server.pem", pki / "server.pem")
    (pki / "ca.crt").write_bytes(ca.cert_pem)
    ca.client("node-1").write_pair(pki / "client.crt", pki / "client.key")
    port = free_port()
    site = f"""
[cluster]
node_name = "node-0"

[site]
serve = true
listen = "127.0.0.1:{port}"
cert_file = "{pki / "server.pem"}"
key_file = "{pki / "server.pem"}"
ca_file = "{pki / "ca.crt"}"
"""
    with Agent(tmp_path / "agent", crio, extra_config=site) as agent:
        agent.wait_log(f"peer_server_started: address=127.0.0.1:{port}")
        context = ssl.create_default_context(cafile=pki / "ca.crt")
        context.load_cert_chain(pki / "client.crt", pki / "client.key")
        status, _, body = fetch(port, context, "GET", "/nodeagent/v1/holdings")
        assert status == 200
        holdings = parse_holdings(body)
        assert (holdings.node, holdings.bundles, holdings.uploads_max) == ("node-0", (), 3)
    with Agent(tmp_path / "quiet", crio) as agent:  # the default: nothing listens
        agent.wait_log("daemon_started")
        assert "peer_server" not in agent.current_run_log()
