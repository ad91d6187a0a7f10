"""``[site] serve = true``: the daemon listens for the peer server's reports and serves
nothing itself; ``nodeagent serve-peers`` (nodeagent-peer.service) serves the store, with
the TLS files from ``$CREDENTIALS_DIRECTORY`` when systemd passes them (decision 0056)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

from nodeagent.site.holdings import parse_holdings
from tests.integration.adapters.http.test_peer import fetch
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.pki import Authority
from tests.testenv.registry import free_port
from tests.testenv.waiting import log_tail, wait_for


def test_the_daemon_leaves_serving_to_the_peer_process_which_serves_with_its_credentials(
    tmp_path: Path, crio: Crio
) -> None:
    ca = Authority("site CA")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    ca.serving("node-0").write_pair(credentials / "peer-cert", credentials / "peer-key")
    (credentials / "peer-ca").write_bytes(ca.cert_pem)
    ca.client("node-1").write_pair(tmp_path / "client.crt", tmp_path / "client.key")
    port = free_port()
    missing = tmp_path / "not-there.pem"  # the [site] paths: only the credentials exist
    site = f"""
[cluster]
node_name = "node-0"

[site]
serve = true
listen = "127.0.0.1:{port}"
cert_file = "{missing}"
key_file = "{missing}"
ca_file = "{missing}"

[mirror]
listen = "127.0.0.1:{free_port()}"
"""
    with Agent(tmp_path / "agent", crio, extra_config=site) as agent:
        agent.wait_log("peer_reports_listening")
        assert "peer_server_started" not in agent.current_run_log()
        assert (agent.run_dir / "peer" / "reports.sock").is_socket()
        command = [sys.executable, "-m", "nodeagent", "--config", str(agent.config_file)]
        check = subprocess.run([*command, "serve-peers", "--check"], check=False)
        assert check.returncode == 0
        env = dict(agent.env(), CREDENTIALS_DIRECTORY=str(credentials))
        log_path = tmp_path / "peer.log"
        with log_path.open("wb") as log:
            peer = subprocess.Popen(
                [*command, "serve-peers"], stdout=log, stderr=log, env=env, cwd=tmp_path
            )
        try:
            wait_for(
                lambda: f"peer_server_started: address=127.0.0.1:{port}" in log_path.read_text(),
                timeout_s=30,
                what="the peer process to listen",
                detail=lambda: log_tail(log_path),
            )
            # the node mirror has its own process (serve-mirror, decision 0063)
            assert "node_mirror_started" not in log_path.read_text()
            context = ssl.create_default_context(cafile=credentials / "peer-ca")
            context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
            status, _, body = fetch(port, context, "GET", "/nodeagent/v1/holdings")
            assert status == 200
            holdings = parse_holdings(body)
            assert (holdings.node, holdings.bundles, holdings.uploads_max) == ("node-0", (), 3)
        finally:
            peer.send_signal(signal.SIGTERM)
            assert peer.wait(timeout=30) == 0
    quiet = "[mirror]\nenabled = false\n"  # with [site] serve's default: nothing listens
    with Agent(tmp_path / "quiet", crio, extra_config=quiet) as agent:
        agent.wait_log("daemon_started")
        assert "peer_" not in agent.current_run_log()
        command = [sys.executable, "-m", "nodeagent", "--config", str(agent.config_file)]
        check = subprocess.run([*command, "serve-peers", "--check"], check=False)
        assert check.returncode == 1  # the unit's ExecCondition: skipped
        off = subprocess.run(
            [*command, "serve-peers"], capture_output=True, text=True, check=False,
            env=dict(os.environ), timeout=60,
        )  # fmt: skip
        assert off.returncode == 0
        assert "peer_server_off" in off.stdout + off.stderr
