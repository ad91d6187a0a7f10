"""The ``--json`` documents of the commands that need a real peer, against their schemas:
``runtime``, ``pull`` and ``check-offline`` against a CRI-O of their own, ``bundle create``
from the session registry, ``bundle import`` of that bundle into the CRI-O (docs/cli.md;
the others: tests/unit/cli/test_json_documents.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from nodeagent.cli.main import main
from tests.conftest import Pushed
from tests.integration.offline.test_runtime_facts import node_config, write_config
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.registry import Registry
from tests.unit.cli import schemas

pytestmark = pytest.mark.integration


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, [*argv, "--json"])
    return code, capsys.readouterr().out


async def test_runtime_pull_and_check_offline(
    tmp_path: Path, fresh_crio: Crio, pushed: Pushed, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path, node_config(tmp_path, fresh_crio))
    ref = pushed.ref(pushed.base_a)
    code, text = await run(capsys, "pull", ref, "--config", str(config_file))
    doc = schemas.check("pull", text)
    assert code == 0 and [p["image"] for p in doc["pulled"]] == [ref]
    code, text = await run(capsys, "runtime", "--config", str(config_file))
    doc = schemas.check("runtime", text)
    assert code == 0 and any(ref in image["names"] for image in doc["images"])
    code, text = await run(capsys, "--config", str(config_file), "check-offline")
    doc = schemas.check("check-offline", text)
    assert code in (0, 1) and doc["offlineReady"] is (code == 0)


async def test_bundle_create_and_import(
    tmp_path: Path, fresh_crio: Crio, registry: Registry, pushed: Pushed,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    public, secret = minisign.generate_keypair(comment="json documents")
    key = tmp_path / "factory.key"
    key.write_text(secret)
    bundle = tmp_path / "bundle"
    code, text = await run(
        capsys, "bundle", "create", "--image", pushed.ref(pushed.base_b), "--key", str(key),
        "--output", str(bundle), "--id", "json-docs", "--arch", "amd64",
        "--insecure-registry", registry.host, "--config", "/nonexistent/nodeagent.toml",
    )  # fmt: skip
    doc = schemas.check("bundle-create", text)
    assert code == 0 and (doc["bundleId"], doc["release"]) == ("json-docs", None)

    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(public)
    imported = agent.cli("bundle", "import", str(bundle), "--json")
    assert imported.returncode == 0, imported.stderr
    report = schemas.check("bundle-import", imported.stdout)  # stdout: the document alone
    assert (report["state"], report["bundleId"]) == ("imported", "json-docs")
    status = agent.cli("status", "--json")
    assert schemas.check("status", status.stdout)["bundles"][0]["bundleId"] == "json-docs"
