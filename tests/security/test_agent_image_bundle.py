"""A bundle carrying nodeagent's own image (``agentImage``, decision 0074), from ``bundle
create --agent-image-statement`` against a real registry, to the daemon's staging
(``daemon.bundles.stage_self_update`` over the node's store) and the host's loader
(``nodeagent-image-load --incoming``, real podman). The attacker holds the bundle key: with
it alone (its own statement, a genuine statement of another image, an old genuine image) no
image is staged, loaded or switched to."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from nodeagent.adapters.bundles.agent_image import AgentImageStager
from nodeagent.bundles import minisign
from nodeagent.daemon.bundles import stage_self_update
from tests.testenv.agent_image import (
    LoaderPaths,
    agent_bundle,
    ed25519_key,
    push_layout,
    run_loader,
    signed_statement,
    tiny_layout,
)
from tests.testenv.registry import Registry

RUNNING = "sha256:" + "b" * 64


@dataclass
class Pushed:
    ref: str
    digest: str


class Factory:
    """A bundle key (the attacker may hold it) and the agent image key (he does not)."""

    def __init__(self, work: Path, registry: Registry) -> None:
        self.work, self.registry = work, registry
        public, secret = minisign.generate_keypair(comment="factory")
        self.bundle_public = public
        (work / "bundle.key").write_text(secret)
        self.agent_key, self.agent_public = ed25519_key(work / "keys", "agent")
        self.bundle_signer_as_ed25519, _ = ed25519_key(work / "keys", "attacker")

    def image(self, version: str) -> Pushed:
        layout, _ = tiny_layout(self.work / f"image-{version}", version)
        return Pushed(*push_layout(self.registry.host, layout, version))

    def bundle(self, image: Pushed, statement: Path, name: str) -> Path:
        secret = (self.work / "bundle.key").read_text()
        return agent_bundle(
            self.work, self.registry.host, image.ref, statement, bundle_id=name, secret=secret
        )


class Node:
    """The node's store holding the bundle as a copy left it, its keys, the host's side."""

    def __init__(self, base: Path, factory: Factory, runroot: Path) -> None:
        self.store = base / "store"
        self.trusted = base / "trusted-keys.d"
        self.trusted.mkdir(parents=True)
        (self.trusted / "factory.pub").write_text(factory.bundle_public)
        self.paths = LoaderPaths.under(base / "host", runroot=runroot)
        shutil.copy(factory.agent_public, self.paths.keys / "agent.pem")
        self.env_file = base / "image.env"
        self.env_file.write_text(f"NODEAGENT_IMAGE_BASE={RUNNING}\n")
        self.dropin = base / "50-self-update.conf"
        self.systemctl = base / "systemctl"
        self.systemctl.write_text(f'#!/bin/sh\necho "$*" >> {base / "systemctl.calls"}\n')
        self.systemctl.chmod(self.systemctl.stat().st_mode | stat.S_IXUSR)
        self.bundle_id = ""
        self.stager = AgentImageStager(self.store, self.trusted, self.paths.keys, self.paths.state)

    def holds(self, bundle: Path) -> None:
        shutil.copytree(bundle / "blobs", self.store / "blobs", dirs_exist_ok=True)
        self.bundle_id = bundle.name  # agent_bundle names the directory after the id
        record = self.store / "bundles" / self.bundle_id
        shutil.rmtree(record, ignore_errors=True)
        record.mkdir(parents=True)
        for name in ("bundle.json", "bundle.json.minisig"):
            shutil.copy(bundle / name, record / name)

    def stage(self) -> tuple[Path | None, list[MutableMapping[str, Any]]]:
        with structlog.testing.capture_logs() as logs:
            staged = stage_self_update(self.stager, self.bundle_id, RUNNING)
        return staged, logs

    def host_load(self) -> subprocess.CompletedProcess[str]:
        env = {
            "NODEAGENT_IMAGE_DROPIN": str(self.dropin),
            "NODEAGENT_IMAGE_ENV": str(self.env_file),
            "NODEAGENT_SYSTEMCTL": str(self.systemctl),
        }
        return run_loader(self.paths, "--incoming", env=env)


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Factory:
    return Factory(tmp_path_factory.mktemp("factory"), registry)


@pytest.fixture
def node(tmp_path: Path, factory: Factory) -> Iterator[Node]:
    with tempfile.TemporaryDirectory(prefix="na-run.") as runroot:
        yield Node(tmp_path / "node", factory, Path(runroot))


def refused(logs: list[MutableMapping[str, Any]]) -> str:
    (line,) = [e for e in logs if e["event"] == "agent_image_refused"]
    assert line["log_level"] == "warning"
    return str(line["reason"])


def test_a_signed_newer_image_travels_from_the_bundle_to_the_unit(
    tmp_path: Path, factory: Factory, node: Node
) -> None:
    image = factory.image("3.0.0")
    statement = tmp_path / "nodeagent-3.0.0.statement"
    signed_statement(statement, factory.agent_key, image.digest, 3000, "3.0.0")
    node.holds(factory.bundle(image, statement, "bundle-good"))
    staged, logs = node.stage()
    assert staged is not None, logs
    assert [e["event"] for e in logs] == ["agent_image_staged"]
    assert logs[0]["sequence"] == 3000 and logs[0]["image"] == image.digest
    assert (staged / "statement").read_bytes() == statement.read_bytes()
    done = node.host_load()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"NODEAGENT_IMAGE_NEXT={image.digest}" in node.dropin.read_text()
    assert f"NODEAGENT_IMAGE_NEXT_BASE={RUNNING}" in node.dropin.read_text()
    exists = node.paths.podman("image", "exists", f"localhost/nodeagent@{image.digest}")
    assert exists.returncode == 0
    assert not staged.exists()


def test_the_bundle_key_alone_stages_nothing(tmp_path: Path, factory: Factory, node: Node) -> None:
    """The attacker signs the statement himself: any key but an agent image key."""
    image = factory.image("6.6.6")
    statement = tmp_path / "evil.statement"
    signed_statement(statement, factory.bundle_signer_as_ed25519, image.digest, 9999, "6.6.6")
    node.holds(factory.bundle(image, statement, "bundle-evil"))
    staged, logs = node.stage()
    assert staged is None
    assert refused(logs) == "ImageSignatureInvalid"
    assert not (node.paths.state / "incoming").exists()


def test_a_genuine_statement_on_another_image_stages_nothing(
    tmp_path: Path, factory: Factory, node: Node
) -> None:
    """A real statement (of image A) re-pointed by a bundle-key holder at his image B:
    bundle.json edited and signed again with the bundle key."""
    genuine, evil = factory.image("4.0.0"), factory.image("4.0.0-evil")
    statement = tmp_path / "genuine.statement"
    signed_statement(statement, factory.agent_key, genuine.digest, 4000, "4.0.0")
    bundle = factory.bundle(genuine, statement, "bundle-swap")
    evil_bundle = factory.bundle(evil, _any_statement(tmp_path, factory, evil), "bundle-evil2")
    text = (evil_bundle / "bundle.json").read_text()
    forged = _replace_statement(text, statement.read_bytes(), (bundle / "bundle.json").read_text())
    _resign(evil_bundle, forged, factory)
    node.holds(evil_bundle)
    staged, logs = node.stage()
    assert staged is None
    assert refused(logs) == "ImageDigestMismatch"


def test_an_older_genuine_image_stages_nothing(
    tmp_path: Path, factory: Factory, node: Node
) -> None:
    (node.paths.state / "sequence").write_text(f"5000 {RUNNING}\n")
    image = factory.image("4.9.0")
    statement = tmp_path / "old.statement"
    signed_statement(statement, factory.agent_key, image.digest, 4999, "4.9.0")
    node.holds(factory.bundle(image, statement, "bundle-old"))
    staged, logs = node.stage()
    assert staged is None
    assert refused(logs) == "ImageRollback"


def _any_statement(tmp_path: Path, factory: Factory, image: Pushed) -> Path:
    path = tmp_path / "any.statement"
    signed_statement(path, factory.agent_key, image.digest, 1, "0.0.1")
    return path


def _replace_statement(evil_json: str, genuine_statement: bytes, genuine_json: str) -> str:
    """The evil bundle's agentImage with the genuine image's statement and signature."""
    evil, genuine = json.loads(evil_json), json.loads(genuine_json)
    evil["agentImage"]["statement"] = genuine_statement.decode()
    evil["agentImage"]["signature"] = genuine["agentImage"]["signature"]
    return json.dumps(evil, indent=2) + "\n"


def _resign(bundle: Path, text: str, factory: Factory) -> None:
    secret = minisign.parse_secret_key((factory.work / "bundle.key").read_text())
    (bundle / "bundle.json").write_text(text)
    signature = minisign.sign(text.encode(), secret, trusted_comment="forged")
    (bundle / "bundle.json.minisig").write_text(signature)
