"""``nodeagent support-dump`` beside the real daemon, CRI-O and store (decision 0072).

Secrets planted where a careless dump would pick them up (a comment in the config file,
the registry auth file and the site's private key the config names) never reach the
archive: every member is searched. The archive is mode 0600, carries CRI-O's version from
the CRI call, the store's bundle and the status; with a status file far over the cap, the
archive stays under ``--max-bytes`` and says what it cut.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests.integration.lifecycle.test_unpin_and_remove import bundles
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.waiting import wait_for
from tests.unit.cli import schemas

pytestmark = pytest.mark.integration

SECRETS = ("SECRET-IN-COMMENT", "SECRET-AUTH-PASSWORD", "SECRET-PRIVATE-KEY")


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]


@pytest.mark.timeout(120)
def test_the_dump_is_secret_free_bounded_and_tells_what_it_holds(
    tmp_path: Path, fresh_crio: Crio
) -> None:
    keys, one, _two = bundles(tmp_path)
    key_file = tmp_path / "site.key"
    key_file.write_text(
        "-----BEGIN PRIVATE KEY-----\nSECRET-PRIVATE-KEY\n-----END PRIVATE KEY-----\n"
    )
    agent = Agent(
        tmp_path / "agent", fresh_crio,
        extra_config=(
            "# password = SECRET-IN-COMMENT\n"
            f'[site]\nkey_file = "{key_file}"\n'
        ),
    )  # fmt: skip
    agent.write_config()
    auth = base64.b64encode(b"user:SECRET-AUTH-PASSWORD").decode()
    agent.auth_file.write_text(json.dumps({"auths": {"registry.example": {"auth": auth}}}))
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    assert agent.cli("bundle", "import", str(one.root)).returncode == 0
    out = tmp_path / "dump.tar.gz"
    with agent:
        assert agent.process is not None
        lock, pid = agent.run_dir / "pins.lock", str(agent.process.pid)
        wait_for(
            lambda: lock.exists() and lock.read_text().strip() == pid,
            timeout_s=30, what="the daemon holding the pin lock",
        )  # fmt: skip
        agent.wait_status(lambda s: set_state(s, "set-a") == "Pinned", what="set-a pinned")
        done = agent.cli("support-dump", "--output", str(out), "--json")
    assert done.returncode == 0, done.stderr
    doc = schemas.check("support-dump", done.stdout)
    assert doc["path"] == str(out) and doc["sizeBytes"] == out.stat().st_size <= doc["capBytes"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    found = members(out)
    assert {"version.json", "runtime.json", "config.json", "store.json", "status.json",
            "README.txt"} <= set(found)  # fmt: skip
    runtime = json.loads(found["runtime.json"])
    assert runtime["name"] == "cri-o" and runtime["version"]
    assert json.loads(found["version.json"])["daemonRunning"] is True
    assert [b["bundleId"] for b in json.loads(found["store.json"])["bundles"]] == ["life-a"]
    assert "set-a" in found["status.json"].decode()
    config = json.loads(found["config.json"])
    assert config["effective"]["site"]["key_file"] == str(key_file)  # the path, not the key
    for name, data in found.items():
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {name}"
    raw = out.read_bytes()
    assert not any(s.encode() in raw for s in SECRETS)

    # The cap: a status file of 3 MiB that does not compress, a cap of 256 KiB.
    (agent.state_dir / "status.json").write_text(os.urandom(3 << 19).hex())
    small = tmp_path / "small.tar.gz"
    done = agent.cli("support-dump", "--output", str(small), "--max-bytes", "256KiB", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert small.stat().st_size <= 256 << 10
    cut = {m["name"]: m["truncated"] for m in doc["members"]}
    assert cut["status.json"] is True and cut["version.json"] is False
    assert b"[cut to " in members(small)["status.json"]
    done = agent.cli("support-dump", "--output", str(small))
    assert done.returncode == 74  # HostFileError: never over an existing file
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: HostFileError: ") and "exists" in line
