"""Attacks on the ECDSA bundle signature where bundles are read, stored and shared
(decision 0075): a stick whose ``bundle.json.ecdsa-sig`` is oversized, a directory, or listed
in the manifest; a trusted-keys directory given an RSA, Ed25519 or P-521 ``.pem``; an older
bundle signed with both schemes and stripped of one signature to escape the other key's
anti-rollback mark; and a peer serving a forged or oversized ECDSA file. Real keys, real
stores, real peer servers over mutual TLS on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from structlog.testing import capture_logs

import nodeagent
from nodeagent.adapters.bundles.intake import check_for_import
from nodeagent.adapters.bundles.tree import verify_bundle
from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles import ecdsa_signature
from nodeagent.bundles.freshness import judge
from nodeagent.bundles.manifest import BundleManifestInvalid
from nodeagent.errors import KeyMalformed, SignatureMalformed
from nodeagent.registries import Platform
from nodeagent.store import layout
from tests.integration.adapters.http.test_fetcher import (
    BUNDLE_ID,
    MIB,
    Site,
    events,
    fetching_node,
    served,
    site_of,
)
from tests.testenv.lying_peer import ScriptedPeer
from tests.testenv.signed_bundles import (
    EcdsaKeys,
    Keys,
    Signed,
    image,
    signed_bundle,
    with_ecdsa,
)

ROOT = Path(nodeagent.__file__).resolve().parents[1]
NO_SWITCH = Path("/nonexistent/fips_enabled")
"""The FIPS switch of a kernel without one: these hosts are not in FIPS mode."""


@pytest.fixture(scope="module")
def ecdsa_keys() -> EcdsaKeys:
    return EcdsaKeys.make()


def small_bundle(
    tmp: Path,
    keys: Keys,
    ecdsa_keys: EcdsaKeys,
    *,
    bundle_id: str = BUNDLE_ID,
    sequence: int | None = None,
) -> Signed:
    """A one-image bundle signed with minisign and ECDSA (the factory's both)."""
    images = [image("fips/app", [(MIB // 4, 7)], tmp / "layers")]
    signed = signed_bundle(
        tmp / bundle_id, keys, images, bundle_id=bundle_id, set_name="fips", sequence=sequence
    )
    return with_ecdsa(signed, ecdsa_keys)


# ---------------------------------------------------------------- the tree on a stick
@pytest.mark.parametrize("form", ["oversized", "directory", "listed"])
def test_a_tree_with_a_bad_ecdsa_sig_is_refused(
    tmp_path: Path, ecdsa_keys: EcdsaKeys, form: str
) -> None:
    keys = Keys.make(tmp_path / "keys")
    ecdsa_keys.install(keys.trusted_dir)
    signed = small_bundle(tmp_path, keys, ecdsa_keys)
    sig = signed.root / "bundle.json.ecdsa-sig"
    if form == "oversized":  # a valid file padded past the bound in its untrusted comment
        sig.write_text(
            "untrusted comment: " + "x" * 2048 + "\n" + sig.read_text().split("\n", 1)[1]
        )
    elif form == "directory":
        sig.unlink()
        sig.mkdir()
    else:  # a manifest listing a file of that name (signed: a factory's mistake or worse)
        doc = json.loads((signed.root / "bundle.json").read_text())
        doc["files"].append({"path": sig.name, "sha256": "0" * 64, "sizeBytes": 1})
        (signed.root / "bundle.json").write_bytes(json.dumps(doc).encode())
        (signed.root / "bundle.json.minisig").unlink()
        with_ecdsa(signed, ecdsa_keys)  # signed again, ECDSA only
    report = verify_bundle(signed.root, keys.trusted_dir, is_full=False, fips_switch=NO_SWITCH)
    expected = {
        "oversized": SignatureMalformed,
        "directory": BundleManifestInvalid,
        "listed": BundleManifestInvalid,
    }[form]
    assert report.error is not None, form
    if form == "directory":  # not a regular file: refused before any crypto
        assert report.error.reason == "BundleUnsafeEntry", report.error
    else:
        assert isinstance(report.error, expected), report.error
    assert report.manifest is None or form == "directory"


# ---------------------------------------------------------------- trusted keys
def _rsa() -> bytes:
    return (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _ed25519() -> bytes:
    return (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _p521() -> bytes:
    return (
        ec.generate_private_key(ec.SECP521R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


@pytest.mark.parametrize("make", [_rsa, _ed25519, _p521], ids=["rsa", "ed25519", "p521"])
def test_a_pem_of_another_kind_or_curve_is_refused_and_check_config_says_so(
    tmp_path: Path, make: Callable[[], bytes]
) -> None:
    keys = Keys.make(tmp_path / "keys")
    (keys.trusted_dir / "intruder.pem").write_bytes(make())
    signed = signed_bundle(
        tmp_path / "b", keys, [image("fips/app", [(4096, 3)], tmp_path / "layers")],
        bundle_id="b", set_name="b",
    )  # fmt: skip
    with pytest.raises(KeyMalformed, match="intruder"):  # never a traceback, never ignored
        check_for_import(signed.root, keys.trusted_dir, Platform("linux", "amd64"))
    config = tmp_path / "config.toml"
    config.write_text(f'[bundles]\ntrusted_keys_dir = "{keys.trusted_dir}"\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    shown = subprocess.run(
        [sys.executable, "-m", "nodeagent", "check-config", "--config", str(config)],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 78, shown.stdout + shown.stderr
    assert "config: NOT usable as it is" in shown.stdout
    assert "SigningKeyMalformed" in shown.stderr and "intruder" in shown.stderr
    assert "Traceback" not in shown.stderr


# ---------------------------------------------------------------- anti-rollback
@pytest.mark.parametrize("stripped", ["bundle.json.minisig", "bundle.json.ecdsa-sig"])
def test_stripping_one_signature_never_escapes_the_other_keys_mark(
    tmp_path: Path, ecdsa_keys: EcdsaKeys, stripped: str
) -> None:
    """The node holds bundle 5 signed with both; bundle 3 (older, also signed with both) is
    presented with one signature removed: its remaining key is linked to the other by the
    stored stamp, so the older bundle is still a rollback."""
    keys = Keys.make(tmp_path / "keys")
    ecdsa_keys.install(keys.trusted_dir)
    store = tmp_path / "store"
    newer = small_bundle(tmp_path, keys, ecdsa_keys, bundle_id="b5", sequence=5)
    copy_bundle(store, newer.root, newer.manifest, keys.trusted_dir, fips_switch=NO_SWITCH)
    older = small_bundle(tmp_path, keys, ecdsa_keys, bundle_id="b3", sequence=3)
    (older.root / stripped).unlink()
    checked = check_for_import(
        older.root, keys.trusted_dir, Platform("linux", "amd64"), fips_switch=NO_SWITCH
    )
    accepted = accepted_stamps(store, keys.trusted_dir, fips_switch=NO_SWITCH)
    candidate = checked.manifest.stamp(checked.key_id_hex, checked.manifest_digest, checked.linked)
    verdict = judge(candidate, accepted)
    assert verdict.verdict == "rollback", verdict
    assert verdict.mark is not None and verdict.mark.bundle_id == "b5"


# ---------------------------------------------------------------- peers
@pytest.fixture
async def site(tmp_path: Path, ecdsa_keys: EcdsaKeys) -> AsyncIterator[Site]:
    keys = Keys.make(tmp_path / "keys")
    ecdsa_keys.install(keys.trusted_dir)
    bundle = small_bundle(tmp_path, keys, ecdsa_keys)
    async with site_of(tmp_path, keys, bundle) as found:
        yield found


def ecdsa_only_trust(site: Site, ecdsa_keys: EcdsaKeys) -> Path:
    """A fetching node that trusts the ECDSA key only."""
    trusted = site.tmp / "fetcher-keys"
    ecdsa_keys.install(trusted)
    return trusted


async def test_a_peer_serving_a_forged_ecdsa_sig_is_demoted_and_nothing_is_stored(
    site: Site, ecdsa_keys: EcdsaKeys
) -> None:
    liar_store = site.node_store("liar")
    sig = liar_store / layout.bundle_dir(BUNDLE_ID) / layout.ECDSA_SIGNATURE_NAME
    other = EcdsaKeys.make()  # signed by an attacker's key, under the trusted key's id
    data = (site.bundle.root / "bundle.json").read_bytes()
    forged = ecdsa_signature.sign(data, other.private_pem, trusted_comment="t").split("\n")
    real = sig.read_text().split("\n")
    algorithm, _, first = forged[1].split(":")
    sig.write_text(
        "\n".join([real[0], f"{algorithm}:{real[1].split(':')[1]}:{first}", *forged[2:]])
    )
    liar = await site.serve("liar", liar_store)
    node = fetching_node(site, trusted_dir=ecdsa_only_trust(site, ecdsa_keys))
    with capture_logs() as logs:
        await node.look(liar)
    await node.client.close()
    assert node.imported == []
    assert not (node.store / layout.bundle_dir(BUNDLE_ID)).exists()
    (demoted,) = events(logs, "peer_demoted")
    assert (demoted["peer"], demoted["reason"]) == (liar, "BundleSignatureInvalid")
    assert node.reports[-1].reason == "BundleSignatureInvalid"
    assert served(site) == [0]  # no blob was asked for


async def test_an_oversized_ecdsa_sig_in_a_peers_store_is_never_served_nor_taken(
    site: Site, ecdsa_keys: EcdsaKeys
) -> None:
    liar_store = site.node_store("liar")
    sig = liar_store / layout.bundle_dir(BUNDLE_ID) / layout.ECDSA_SIGNATURE_NAME
    sig.write_bytes(sig.read_bytes() + b"#" * (1 << 20))
    liar = await site.serve("liar", liar_store)
    node = fetching_node(site, trusted_dir=ecdsa_only_trust(site, ecdsa_keys))
    with capture_logs() as logs:
        await node.look(liar)
    await node.client.close()
    assert node.imported == []
    assert not (node.store / layout.bundle_dir(BUNDLE_ID)).exists()
    # the peer's server never serves a file over its bound (404): the node has only the
    # minisign signature, whose key it does not trust
    (refused,) = events(logs, "bundle_fetch_refused")
    assert refused["reason"] == "BundleSignedByUnknownKey", refused
    assert served(site) == [0]


async def test_a_lying_peer_sending_an_oversized_ecdsa_sig_is_cut_off_and_demoted(
    site: Site, ecdsa_keys: EcdsaKeys
) -> None:
    """A scripted peer (its certificate the site's) answers ``bundle.json.ecdsa-sig`` with
    64 KiB: the client reads at most the 1 KiB bound (and one byte), the peer is demoted for
    a bad answer, and nothing is stored."""
    pem = site.tmp / "liar-server.pem"
    site.ca.serving("liar").write_pair(pem, pem)
    liar = ScriptedPeer(
        site.tmp / "liar", [site.bundle.root], pem, site.ca_file,
        addr="127.0.0.1", port=0, mode="big-ecdsa-sig",
    )  # fmt: skip
    try:
        node = fetching_node(site, trusted_dir=ecdsa_only_trust(site, ecdsa_keys))
        with capture_logs() as logs:
            await node.look(liar.address)
        await node.client.close()
    finally:
        liar.close()
    assert liar.requests("bundle.json.ecdsa-sig"), liar.requests()
    assert node.imported == []
    assert not (node.store / layout.bundle_dir(BUNDLE_ID)).exists()
    (demoted,) = events(logs, "peer_demoted")
    assert (demoted["peer"], demoted["reason"]) == (liar.address, "PeerAnswerInvalid")
    assert not liar.requests("/blobs/")


async def test_an_ecdsa_only_bundle_is_fetched_and_kept_without_a_minisign_file(
    tmp_path: Path, ecdsa_keys: EcdsaKeys
) -> None:
    keys = Keys.make(tmp_path / "keys")
    ecdsa_keys.install(keys.trusted_dir)
    bundle = small_bundle(tmp_path, keys, ecdsa_keys)
    (bundle.root / "bundle.json.minisig").unlink()
    async with site_of(tmp_path, keys, bundle) as site:
        peer = await site.serve("node-0", site.node_store("node-0"))
        node = fetching_node(site, trusted_dir=ecdsa_only_trust(site, ecdsa_keys))
        await node.look(peer)
        await node.client.close()
    assert node.imported == [BUNDLE_ID]
    kept = node.store / layout.bundle_dir(BUNDLE_ID)
    assert (kept / layout.ECDSA_SIGNATURE_NAME).is_file()
    assert not (kept / layout.SIGNATURE_NAME).exists()
    assert (kept / layout.RECORD_NAME).is_file()
