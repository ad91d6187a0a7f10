"""The node mirror end to end: the daemon keeps its credential, ``nodeagent serve-mirror``
serves it and reports to the daemon, and the status file, ``nodeagent status`` (plain and
``--json``) say whether it serves, what it holds, and what local clients asked for in vain.

The store is empty: the mirror answers 404 and counts each digest asked for.
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.registry import free_port
from tests.testenv.waiting import log_tail, wait_for

DIGEST = "sha256:" + "5e" * 32


def ask(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def mirror_of(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = status.get("nodeMirror") or {}
    return found


def test_the_mirror_serves_reports_and_is_said_in_the_status(tmp_path: Path, crio: Crio) -> None:
    port = free_port()
    extra = f'[mirror]\nlisten = "127.0.0.1:{port}"\n'
    with Agent(tmp_path / "agent", crio, extra_config=extra) as agent:
        agent.wait_log("mirror_credential_published")
        auth = json.loads(agent.mirror_auth_file.read_text())["auths"][f"127.0.0.1:{port}"]
        assert agent.mirror_auth_file.stat().st_mode & 0o077 == 0
        verifiers = (agent.run_dir / "peer" / "mirror-credentials").read_text()
        assert base64.b64decode(auth["auth"]).decode().partition(":")[2] not in verifiers
        agent.wait_log("peer_reports_listening")  # the unit starts After=nodeagent.service
        command = [sys.executable, "-m", "nodeagent", "--config", str(agent.config_file)]
        log_path = tmp_path / "peer.log"
        with log_path.open("wb") as log:
            peer = subprocess.Popen(
                [*command, "serve-mirror"], stdout=log, stderr=log, env=agent.env(), cwd=tmp_path
            )
        try:
            wait_for(
                lambda: "node_mirror_started" in log_path.read_text(),
                timeout_s=30,
                what="the node mirror to listen",
                detail=lambda: log_tail(log_path),
            )
            agent.wait_status(lambda s: mirror_of(s).get("serving") is True, what="serving")
            assert ask(port, "/v2/") == 401  # a Basic challenge: clients send their entry
            assert ask(port, "/v2/", {"Authorization": f"Basic {auth['auth']}"}) == 200
            assert ask(port, f"/v2/example/app/manifests/{DIGEST}") == 404  # empty store
            status = agent.wait_status(
                lambda s: DIGEST in mirror_of(s).get("recentMissing", []),
                what="the missing digest in the status",
                timeout_s=30,
            )
            assert mirror_of(status)["blobs"] == 0 and mirror_of(status)["registryBlobs"] == 0
            shown = agent.cli("status")
            assert f"node mirror: serving on 127.0.0.1:{port}" in shown.stdout, shown.stdout
            as_json = json.loads(agent.cli("status", "--json").stdout)
            assert as_json["nodeMirror"]["listen"] == f"127.0.0.1:{port}"
        finally:
            peer.send_signal(signal.SIGTERM)
            assert peer.wait(timeout=30) == 0
        agent.wait_status(lambda s: mirror_of(s).get("serving") is False, what="stopped")
