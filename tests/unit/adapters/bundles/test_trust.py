"""The trusted keys of both schemes and the one check of a manifest's signatures
(``adapters.bundles.trust``, decision 0075): ``*.pem`` ECDSA keys beside the ``*.pub``
minisign ones, the kernel's FIPS switch read from the configured path, and a bundle
directory's ``bundle.json.ecdsa-sig`` read and verified by the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.bundles.tree import read_signed_manifest, verify_bundle
from nodeagent.adapters.bundles.trust import MAX_TRUSTED_KEYS, load_trusted_keys_dir
from nodeagent.bundles import ecdsa_signature
from nodeagent.errors import Ed25519Refused, KeyMalformed, UnknownSigningKey
from tests.testenv.signed_bundles import EcdsaKeys
from tests.unit.adapters.bundles.test_tree import Keys, _write_bundle


@pytest.fixture(scope="module")
def ecdsa_keys() -> EcdsaKeys:
    return EcdsaKeys.make()


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "trusted")


def switch(tmp_path: Path, value: str | None) -> Path:
    """The FIPS switch as the kernel shows it (None: a kernel without one)."""
    path = tmp_path / "proc" / "sys" / "crypto" / "fips_enabled"
    if value is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    return path


def signed_with_ecdsa(root: Path, keys: Keys, ecdsa_keys: EcdsaKeys, *, minisign: bool) -> None:
    root.mkdir()
    data = _write_bundle(root, keys)
    text = ecdsa_signature.sign(data, ecdsa_keys.private_pem, trusted_comment="unit bundle")
    (root / "bundle.json.ecdsa-sig").write_text(text)
    if not minisign:
        (root / "bundle.json.minisig").unlink()


def test_pem_keys_are_read_beside_the_pub_ones_with_the_switch(
    tmp_path: Path, keys: Keys, ecdsa_keys: EcdsaKeys
) -> None:
    ecdsa_keys.install(keys.dir, "line-3")
    trusted = load_trusted_keys_dir(keys.dir, fips_switch=switch(tmp_path, "1\n"))
    assert [k.name for k in trusted.minisign.values()] == ["factory"]
    assert [k.name for k in trusted.ecdsa.values()] == ["line-3"]
    assert (len(trusted), trusted.host_fips) == (2, True)
    assert load_trusted_keys_dir(keys.dir, fips_switch=switch(tmp_path, "0")).host_fips is False
    assert load_trusted_keys_dir(keys.dir, fips_switch=tmp_path / "absent").host_fips is None


@pytest.mark.parametrize(
    "text",
    ["garbage", "-----BEGIN PUBLIC KEY-----\n" + "A" * 5000 + "\n", "\udcff"],
    ids=["garbage", "oversized", "not-utf8"],
)
def test_a_bad_pem_is_a_reason_code_naming_the_file(keys: Keys, text: str) -> None:
    (keys.dir / "broken.pem").write_bytes(text.encode(errors="surrogateescape"))
    with pytest.raises(KeyMalformed, match="broken"):
        load_trusted_keys_dir(keys.dir)


def test_the_same_ecdsa_key_twice_or_too_many_files_is_an_error(
    keys: Keys, ecdsa_keys: EcdsaKeys
) -> None:
    ecdsa_keys.install(keys.dir, "one")
    ecdsa_keys.install(keys.dir, "two")
    with pytest.raises(KeyMalformed, match="same key id"):
        load_trusted_keys_dir(keys.dir)
    for n in range(MAX_TRUSTED_KEYS):
        (keys.dir / f"k{n}.pub").write_text("x")
    with pytest.raises(KeyMalformed, match="more than 256"):
        load_trusted_keys_dir(keys.dir)


def test_an_ecdsa_only_bundle_verifies_by_its_pem_key(
    tmp_path: Path, keys: Keys, ecdsa_keys: EcdsaKeys
) -> None:
    root = tmp_path / "bundle"
    signed_with_ecdsa(root, keys, ecdsa_keys, minisign=False)
    absent = tmp_path / "absent"
    with pytest.raises(UnknownSigningKey):  # only the minisign key is trusted
        read_signed_manifest(root, load_trusted_keys_dir(keys.dir, fips_switch=absent))
    ecdsa_keys.install(keys.dir)
    manifest, verified = read_signed_manifest(
        root, load_trusted_keys_dir(keys.dir, fips_switch=absent)
    )
    key = ecdsa_signature.load_public_key(ecdsa_keys.public_pem.decode(), name="x")
    assert manifest.bundle_id == "unit"
    assert verified.schemes == ("ecdsa-p256-sha256",)
    assert (verified.key_name, verified.linked) == ("factory-fips", ())
    assert verified.key_id_hex == f"{int.from_bytes(key.key_id, 'little'):X}"


def test_R43_both_signatures_verify_and_a_fips_host_looks_only_at_ecdsa(
    tmp_path: Path, keys: Keys, ecdsa_keys: EcdsaKeys
) -> None:
    root = tmp_path / "bundle"
    signed_with_ecdsa(root, keys, ecdsa_keys, minisign=True)
    ecdsa_keys.install(keys.dir)
    _, verified = read_signed_manifest(root, load_trusted_keys_dir(keys.dir))
    assert verified.schemes == ("minisign", "ecdsa-p256-sha256")
    assert verified.key_id_hex == keys.public.key_id_hex and len(verified.linked) == 1
    on = switch(tmp_path, "1")
    _, fips = read_signed_manifest(root, load_trusted_keys_dir(keys.dir, fips_switch=on))
    assert fips.schemes == ("ecdsa-p256-sha256",) and fips.key_id_hex == verified.linked[0]
    (root / "bundle.json.ecdsa-sig").unlink()
    report = verify_bundle(root, keys.dir, is_full=False, fips_switch=on)
    assert report.error is not None and isinstance(report.error, Ed25519Refused)
    assert "no ECDSA signature" in report.error.message


def test_verify_reports_the_signatures_it_checked(
    tmp_path: Path, keys: Keys, ecdsa_keys: EcdsaKeys
) -> None:
    root = tmp_path / "bundle"
    signed_with_ecdsa(root, keys, ecdsa_keys, minisign=True)
    ecdsa_keys.install(keys.dir)
    report = verify_bundle(root, keys.dir, fips_switch=tmp_path / "absent")
    assert report.is_ok, report.error
    assert report.to_json()["signedBy"]["signatures"] == ["minisign", "ecdsa-p256-sha256"]
