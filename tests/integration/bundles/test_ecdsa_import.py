"""``bundle import`` of bundles signed with ECDSA (decision 0075): on a node not in FIPS
mode an ECDSA-only bundle imports by its trusted ``.pem`` key; on a node whose FIPS switch
reads 1 a minisign-only bundle is refused with ``Ed25519Refused`` (its key trusted all the
same) and a bundle signed with both imports by its ECDSA signature, the store keeping only
the signature it verified.

Real parts: ``nodeagent bundle import`` (the CLI, its store copy and its loopback session
server), CRI-O, bundles signed with real keys. The FIPS switch is a file under the test's
directory (``[bundles] fips_switch``): this machine's kernel has none, and its OpenSSL has
no FIPS provider, so the crypto itself is the ordinary one (decision 0075, "Left")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.images import default_cache_dir
from tests.testenv.signed_bundles import EcdsaKeys, Keys, image, signed_bundle, with_ecdsa

pytestmark = pytest.mark.integration

MIB = 1 << 20


def agent_with_switch(tmp_path: Path, crio: Crio, value: str) -> tuple[Agent, Path]:
    agent = Agent(tmp_path / "agent", crio)
    agent.write_config()
    switch = agent.base / "proc" / "sys" / "crypto" / "fips_enabled"
    switch.parent.mkdir(parents=True, exist_ok=True)
    switch.write_text(value)
    dropin = agent.config_file.parent / "config.d" / "10-fips-switch.toml"
    dropin.write_text(f'[bundles]\nfips_switch = "{switch}"\n')
    return agent, switch


def stored(agent: Agent, bundle_id: str) -> set[str]:
    directory = agent.state_dir / "store" / "bundles" / bundle_id
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def test_an_ecdsa_only_bundle_imports_on_a_node_not_in_fips_mode(
    tmp_path: Path, crio: Crio
) -> None:
    keys, ecdsa = Keys.make(tmp_path / "keys"), EcdsaKeys.make()
    images = [image("fips/plain", [(MIB, 2911)], default_cache_dir())]
    bundle = signed_bundle(
        tmp_path / "bundle", keys, images, bundle_id="ecdsa-only", set_name="ecdsa-only"
    )
    with_ecdsa(bundle, ecdsa, keep_minisign=False)
    agent, _ = agent_with_switch(tmp_path, crio, "0\n")
    ecdsa.install(agent.trusted_keys_dir)  # the minisign key is not trusted here
    done = agent.cli("bundle", "import", str(bundle.root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert stored(agent, "ecdsa-only") >= {"bundle.json", "bundle.json.ecdsa-sig", "record.json"}
    assert "bundle.json.minisig" not in stored(agent, "ecdsa-only")
    shown = agent.cli("bundle", "verify", str(bundle.root))
    assert "signatures verified: ecdsa-p256-sha256" in shown.stdout, shown.stdout + shown.stderr


def test_a_fips_node_refuses_minisign_only_and_imports_by_the_ecdsa_signature(
    tmp_path: Path, crio: Crio
) -> None:
    keys, ecdsa = Keys.make(tmp_path / "keys"), EcdsaKeys.make()
    cache = default_cache_dir()
    minisign_only = signed_bundle(
        tmp_path / "old", keys, [image("fips/old", [(MIB, 2921)], cache)],
        bundle_id="minisign-only", set_name="minisign-only",
    )  # fmt: skip
    both = with_ecdsa(
        signed_bundle(
            tmp_path / "both", keys, [image("fips/both", [(MIB, 2931)], cache)],
            bundle_id="both-signed", set_name="both-signed", created="2026-01-02T00:00:00Z",
        ),
        ecdsa,
    )  # fmt: skip
    agent, _ = agent_with_switch(tmp_path, crio, "1\n")
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    checked = agent.cli("check-config")
    assert "holds no ECDSA key (*.pem)" in checked.stdout, checked.stdout + checked.stderr
    ecdsa.install(agent.trusted_keys_dir)
    refused = agent.cli("bundle", "import", str(minisign_only.root))
    assert refused.returncode == 65, refused.stdout + refused.stderr  # a refused bundle
    assert "Ed25519Refused" in refused.stderr and "no ECDSA signature" in refused.stderr
    assert stored(agent, "minisign-only") == set()
    done = agent.cli("bundle", "import", str(both.root))
    assert done.returncode == 0, done.stdout + done.stderr
    kept = stored(agent, "both-signed")
    assert "bundle.json.ecdsa-sig" in kept and "bundle.json.minisig" not in kept, kept
    status = agent.cli("status")
    assert "both-signed" in status.stdout, status.stdout + status.stderr
