"""A disconnected site through the real CRI-O: the images' own registry is unreachable, their
mirror (registries.conf.d) requires credentials that only CRI-O's ``global_auth_file`` holds.

nodeagent's own auth file has no entry for the mirror: its disk sizing takes the entry from
the file CRI-O's configuration names, and its pulls pass no credentials, so CRI-O
authenticates the mirror from that same file.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.conftest import Pushed
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry, free_port

USER, PASSWORD = "mirror-reader", "mirror-s3cret"


async def test_pinned_through_a_credentialed_mirror_with_the_source_unreachable(
    registry: Registry, pushed: Pushed, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    ref = pushed.base_a.reference(dead)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    with Registry(
        tmp_path / "mirror", htpasswd_users={USER: PASSWORD}, storage_root=registry.root
    ) as mirror:
        crio_auth = tmp_path / "crio-auth.json"
        crio_auth.write_text(json.dumps({"auths": {mirror.host: {"auth": token}}}))
        with Crio(
            tmp_path / "crio",
            insecure_registries=[mirror.host, dead],
            image_settings=f'global_auth_file = "{crio_auth}"',
        ) as crio:
            (crio.registries_dir / "50-mirror.conf").write_text(
                f'[[registry]]\nlocation = "{dead}"\ninsecure = true\n'
                f'[[registry.mirror]]\nlocation = "{mirror.host}"\ninsecure = true\n'
            )
            crio.reload()
            agent = Agent(tmp_path / "agent", crio)
            agent.write_config()
            agent.auth_file.write_text(json.dumps({"auths": {}}))
            agent.write_set("mirrored", [ref])
            with agent:
                agent.wait_status(lambda s: set_state(s, "mirrored") == "Pinned", what="pinned")
        lines = mirror.log_path.read_text().splitlines()
    served = [line for line in lines if "/manifests/" in line and 'HTTP/1.1" 200 ' in line]
    assert served  # the mirror served the manifests (to nodeagent's sizing and to CRI-O)
    log = agent.log_text()
    assert PASSWORD not in log and token not in log
