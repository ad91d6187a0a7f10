"""`nodeagent bundle create` and `bundle verify` against the real registry, skopeo and minisign.

One bundle (two images, a multi-arch index, a PinnedImageSet) is made once per module
from the session registry; each tampering test works on its own copy of it.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.authfile import parse_auth_file
from nodeagent.bundles import minisign
from nodeagent.cli import main as cli
from nodeagent.errors import RegistryUnavailable
from tests.conftest import Pushed
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry
from tests.testenv.signed_bundles import EcdsaKeys

pytestmark = pytest.mark.integration

SET_NAME = "line-3-apps"
BUNDLE_ID = "line-3-test"
NO_CONFIG = "/nonexistent/nodeagent/config.toml"  # defaults: the file need not exist


@dataclass(frozen=True)
class Keys:
    pub: Path
    key: Path
    trusted_dir: Path
    key_id_hex: str

    def secret(self) -> minisign.SecretKey:
        return minisign.parse_secret_key(self.key.read_text())


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(*args: str | Path) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["--config", NO_CONFIG, *map(str, args)])
    return Result(code, out.getvalue(), err.getvalue())


def make_keys(directory: Path, name: str = "factory") -> Keys:
    public_text, secret_text = minisign.generate_keypair(comment="bundle test")
    directory.mkdir(parents=True, exist_ok=True)
    pub, key = directory / f"{name}.pub", directory / f"{name}.key"
    pub.write_text(public_text)
    key.write_text(secret_text)
    trusted = directory / "trusted-keys.d"
    trusted.mkdir()
    shutil.copy(pub, trusted / pub.name)
    return Keys(pub, key, trusted, minisign.parse_public_key(public_text).key_id_hex)


def set_yaml(name: str, images: list[str]) -> str:
    items = "".join(f"    - name: {image}\n" for image in images)
    return (
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"
        f"metadata:\n  name: {name}\nspec:\n  pinnedImages:\n{items}"
    )


def verify(path: Path, keys: Keys, *extra: str) -> Result:
    return run_cli("bundle", "verify", path, "--trusted-keys", keys.trusted_dir, *extra)


def blob(path: Path, digest: str) -> Path:
    return path / "blobs" / "sha256" / digest.removeprefix("sha256:")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def made(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry, pushed: Pushed, keys: Keys
) -> Path:
    """The bundle: base_a and base_b by --image, the index only through the set's file."""
    work = tmp_path_factory.mktemp("made")
    set_file = work / "set.yaml"
    set_file.write_text(
        set_yaml(SET_NAME, [pushed.ref(pushed.base_a), pushed.ref(pushed.multiarch)])
    )
    output = work / "bundle"
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_a), pushed.ref(pushed.base_b),
        "--pinned-image-set", set_file, "--key", keys.key, "--output", output,
        "--id", BUNDLE_ID, "--arch", "amd64", "--insecure-registry", registry.host,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert f"created bundle {BUNDLE_ID}" in result.out
    return output


@pytest.fixture
def copy(made: Path, tmp_path: Path) -> Path:
    """A private copy of the bundle to tamper with."""
    return Path(shutil.copytree(made, tmp_path / "copy", symlinks=True))


# ---------------------------------------------------------------- the good bundle


def test_verify_accepts_it_and_reports_what_it_holds(
    made: Path, keys: Keys, pushed: Pushed
) -> None:
    result = verify(made, keys, "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert (doc["ok"], doc["full"], doc["error"]) == (True, True, None)
    assert doc["bundleId"] == BUNDLE_ID
    assert doc["architecture"] == "amd64"
    assert doc["signedBy"] == {
        "keyId": keys.key_id_hex, "keyName": "factory", "signatures": ["minisign"]
    }  # fmt: skip
    assert doc["trustedComment"].startswith(f"nodeagent bundle {BUNDLE_ID} created 20")
    assert doc["pinnedImageSets"] == [SET_NAME]
    images = {i["name"]: i for i in doc["images"]}
    refs = [pushed.ref(p) for p in (pushed.base_a, pushed.base_b, pushed.multiarch)]
    assert list(images) == refs  # --image order first, then the set's own images
    for image in (pushed.base_a, pushed.base_b):
        manifest_bytes = blob(made, image.digest).stat().st_size
        entry = images[pushed.ref(image)]
        assert entry["manifestDigest"] == image.digest
        assert entry["sizeBytes"] == image.total_size_bytes + manifest_bytes
    assert images[refs[2]]["manifestDigest"] == pushed.multiarch.digest
    assert doc["hashedBytes"] == doc["totalSizeBytes"] > 0


def test_human_output_names_bundle_key_and_images(made: Path, keys: Keys, pushed: Pushed) -> None:
    result = verify(made, keys)
    assert result.code == 0, result.err
    assert f"bundle {BUNDLE_ID}: authentic and complete" in result.out
    assert f"signed by key {keys.key_id_hex} (factory)" in result.out
    assert pushed.ref(pushed.base_b) in result.out
    assert result.err == ""


def test_layout_holds_the_index_and_only_the_amd64_child(made: Path, pushed: Pushed) -> None:
    multi = pushed.multiarch
    assert blob(made, multi.digest).is_file()
    assert blob(made, multi.child_digests[0]).is_file()  # amd64
    assert not blob(made, multi.child_digests[1]).exists()  # arm64: not for this node
    assert blob(made, multi.layer_digests[0]).is_file()
    assert not blob(made, multi.layer_digests[1]).exists()
    index = json.loads((made / "index.json").read_text())
    names = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
    assert names[pushed.ref(multi)]["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert names[pushed.ref(multi)]["digest"] == multi.digest
    assert json.loads((made / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    doc = json.loads((made / "bundle.json").read_text())
    [item] = doc["pinnedImageSets"]
    assert item["persistent"] is True
    assert item["object"]["metadata"]["name"] == SET_NAME
    shared = pushed.base_a.layer_digests[0]  # the base layer both apps share
    assert [b["digest"] for b in doc["blobs"]].count(shared) == 1


def test_debian_minisign_accepts_the_signature(made: Path, keys: Keys) -> None:
    ensure_packages({"minisign": "/usr/bin/minisign"})
    result = subprocess.run(
        ["minisign", "-V", "-m", made / "bundle.json", "-p", keys.pub],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"Trusted comment: nodeagent bundle {BUNDLE_ID} created" in result.stdout


def _skopeo(*args: str | Path) -> subprocess.CompletedProcess[str]:
    ensure_packages({"skopeo": "/usr/bin/skopeo"})
    command = ["skopeo", "--override-os", "linux", "--override-arch", "amd64", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize("image", ["base_a", "base_b", "multiarch"])
def test_skopeo_reads_each_image_of_the_layout(
    made: Path, pushed: Pushed, tmp_path: Path, image: str
) -> None:
    pushed_image = getattr(pushed, image)
    source = f"oci:{made}:{pushed.ref(pushed_image)}"
    inspected = _skopeo("inspect", source)
    assert inspected.returncode == 0, inspected.stderr
    layers = json.loads(inspected.stdout)["Layers"]
    assert layers
    assert layers == list(pushed_image.layer_digests[: len(layers)])
    copied = _skopeo("copy", "--quiet", source, f"dir:{tmp_path / 'x'}")
    assert copied.returncode == 0, copied.stderr
    for digest in layers:
        assert (tmp_path / "x" / digest.removeprefix("sha256:")).is_file()


# ---------------------------------------------------------------- tampering


def _resign(path: Path, keys: Keys, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite bundle.json with ``change`` and sign it again with the test key."""
    doc = json.loads((path / "bundle.json").read_text())
    change(doc)
    data = json.dumps(doc).encode()
    (path / "bundle.json").write_bytes(data)
    signature = minisign.sign(data, keys.secret(), trusted_comment="re-signed by the test")
    (path / "bundle.json.minisig").write_text(signature)


def _largest_blob(path: Path) -> Path:
    return max((path / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)


def _flip_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


def _other_key(path: Path, _: Keys) -> None:
    stranger = make_keys(path.parent / "stranger", "stranger")
    data = (path / "bundle.json").read_bytes()
    signature = minisign.sign(data, stranger.secret(), trusted_comment="x")
    (path / "bundle.json.minisig").write_text(signature)


def _link_out(path: Path, name: str) -> None:
    """Move ``name`` out of the bundle and leave a symlink to it (same bytes) in its place."""
    (path / name).rename(path.parent / name)
    (path / name).symlink_to(path.parent / name)


def _unsafe_path(path: Path, keys: Keys) -> None:
    outside = {"path": "../outside", "sha256": "0" * 64, "sizeBytes": 1}
    _resign(path, keys, lambda doc: doc["files"].append(outside))


def _drop_last_image(path: Path, keys: Keys) -> None:
    _resign(path, keys, lambda doc: doc["images"].pop())  # the set still names it


def _modify_after_signing(path: Path, _: Keys) -> None:
    text = (path / "bundle.json").read_text()
    (path / "bundle.json").write_text(text.replace(BUNDLE_ID, "line-4-test"))


def _truncate_largest_blob(path: Path, _: Keys) -> None:
    largest = _largest_blob(path)
    os.truncate(largest, largest.stat().st_size - 1)


Tamper = Callable[[Path, Keys], object]
TAMPERING: dict[str, tuple[Tamper, str]] = {
    "signed by an unknown key": (_other_key, "BundleSignedByUnknownKey"),
    "no signature": (lambda p, _: (p / "bundle.json.minisig").unlink(), "BundleUnsigned"),
    "empty signature": (lambda p, _: (p / "bundle.json.minisig").write_text(""), "BundleUnsigned"),
    "extra file": (lambda p, _: (p / "README").write_text("hi"), "BundleUnlistedFile"),
    "extra blob": (
        lambda p, _: (p / "blobs" / "sha256" / ("0" * 64)).write_bytes(b"x"),
        "BundleUnlistedFile",
    ),
    "extra directory": (lambda p, _: (p / "blobs" / "sha512").mkdir(), "BundleUnlistedFile"),
    "symlink": (lambda p, _: _link_out(p, "oci-layout"), "BundleUnsafeEntry"),
    "symlinked blob directory": (lambda p, _: _link_out(p, "blobs"), "BundleUnsafeEntry"),
    "fifo": (lambda p, _: os.mkfifo(p / "pipe"), "BundleUnsafeEntry"),
    "bundle.json is a symlink": (lambda p, _: _link_out(p, "bundle.json"), "BundleUnsafeEntry"),
    "'..' path in the manifest": (_unsafe_path, "BundleUnsafePath"),
    "set names an image not carried": (_drop_last_image, "BundleSetInvalid"),
    "truncated blob": (_truncate_largest_blob, "BundleSizeMismatch"),
    "flipped byte in a blob": (lambda p, _: _flip_byte(_largest_blob(p)), "BundleDigestMismatch"),
    "missing blob": (lambda p, _: _largest_blob(p).unlink(), "BundleIncomplete"),
    "bundle.json modified after signing": (_modify_after_signing, "BundleSignatureInvalid"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_bundle_is_refused_with_its_reason(copy: Path, keys: Keys, case: str) -> None:
    assert verify(copy, keys).code == 0  # the copy is good before the change
    tamper, reason = TAMPERING[case]
    tamper(copy, keys)
    result = verify(copy, keys, "--json")
    assert result.code == 65, result.err
    assert result.json()["error"]["reason"] == reason
    assert result.json()["ok"] is False
    assert f"error: {reason}: " in result.err
    human = verify(copy, keys)
    assert human.code == 65
    assert "REFUSED" in human.out


def test_unknown_key_message_names_the_key(copy: Path, keys: Keys) -> None:
    _other_key(copy, keys)
    error = verify(copy, keys, "--json").json()["error"]
    assert keys.key_id_hex in error["message"]  # the trusted key, listed
    assert "(factory)" in error["message"]


# ---------------------------------------------------------------- create refuses


def test_tag_reference_is_refused(registry: Registry, keys: Keys, tmp_path: Path) -> None:
    ref = f"{registry.host}/nodeagent-test/app-a:latest"
    result = run_cli(
        "bundle", "create", "--image", ref, "--key", keys.key, "--output", tmp_path / "o"
    )
    assert result.code == 65
    assert "ImageReferenceInvalid" in result.err
    assert "tag reference" in result.err and "skopeo inspect" in result.err
    assert not (tmp_path / "o").exists()


def test_image_of_another_architecture_is_refused(
    registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_a), "--key", keys.key,
        "--output", tmp_path / "o", "--arch", "arm64", "--insecure-registry", registry.host,
    )  # fmt: skip
    assert result.code == 1  # ImageNotFound
    assert "is a linux/amd64 image and the bundle is for linux/arm64" in result.err
    assert not (tmp_path / "o" / "bundle.json").exists()


def test_arm64_bundle_takes_the_arm64_child(
    registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    output = tmp_path / "arm"
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.multiarch), "--key", keys.key,
        "--output", output, "--arch", "arm64", "--insecure-registry", registry.host, "--transient",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert blob(output, pushed.multiarch.child_digests[1]).is_file()
    assert not blob(output, pushed.multiarch.child_digests[0]).exists()
    doc = verify(output, keys, "--json").json()
    assert (doc["ok"], doc["architecture"]) == (True, "arm64")
    assert doc["bundleId"].startswith("bundle-arm64-")
    assert verify(output, keys, "--arch", "arm64").code == 0
    for_amd64 = verify(output, keys, "--arch", "amd64", "--json")
    assert for_amd64.code == 65
    assert for_amd64.json()["error"]["reason"] == "BundleArchitectureMismatch"


def test_a_targeted_bundle_carries_its_target_signed_and_verify_shows_it(
    registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    output = tmp_path / "targeted"
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.multiarch), "--key", keys.key,
        "--output", output, "--target-arch", "arm64", "--insecure-registry", registry.host,
        "--target-selector", "site=line-3, node-role.kubernetes.io/worker",
    )  # fmt: skip
    assert result.code == 0, result.err
    selector = "node-role.kubernetes.io/worker,site=line-3"
    assert f"for arm64 nodes matching '{selector}'" in result.out
    data = (output / "bundle.json").read_bytes()
    signature = (output / "bundle.json.minisig").read_text()
    trusted = minisign.load_trusted_keys({"factory": keys.pub.read_text()})
    minisign.verify(data, signature, trusted)  # the target is in the signed bytes
    doc = json.loads(data)
    assert doc["formatVersion"] == 3  # what bundle create writes: a target and a sequence
    assert (doc["architecture"], doc["target"]) == ("arm64", {"nodeSelector": selector})
    assert blob(output, pushed.multiarch.child_digests[1]).is_file()  # the arm64 child only
    assert not blob(output, pushed.multiarch.child_digests[0]).exists()
    shown = verify(output, keys, "--arch", "arm64", "--json")
    assert shown.code == 0, shown.err
    assert shown.json()["target"] == {"nodeSelector": selector}
    text = verify(output, keys, "--arch", "arm64")
    assert f"for arm64 nodes matching '{selector}'" in text.out
    # An image of another architecture is refused as with --arch.
    refused = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_a), "--key", keys.key,
        "--output", tmp_path / "o", "--target-arch", "arm64",
        "--target-selector", "site=line-3", "--insecure-registry", registry.host,
    )  # fmt: skip
    assert "is a linux/amd64 image and the bundle is for linux/arm64" in refused.err
    assert not (tmp_path / "o" / "bundle.json").exists()


def test_ecdsa_key_signs_beside_or_instead_of_minisign_and_verify_checks_both(
    registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    """``--ecdsa-key`` (decision 0075): with ``--key`` both signatures, same trusted comment;
    alone, an ECDSA-only bundle; either verifies by its trusted key, both when both are
    trusted; a key that is not P-256/P-384 is refused before anything is fetched."""
    ecdsa_keys = EcdsaKeys.make()
    private = tmp_path / "factory-fips.key.pem"
    private.write_bytes(ecdsa_keys.private_pem)
    both, only = tmp_path / "both", tmp_path / "only"
    for output, key_args in ((both, ["--key", str(keys.key)]), (only, [])):
        result = run_cli(
            "bundle", "create", "--image", pushed.ref(pushed.base_a), *key_args,
            "--ecdsa-key", private, "--output", output, "--insecure-registry", registry.host,
        )  # fmt: skip
        assert result.code == 0, result.err
        assert "ECDSA signature (bundle.json.ecdsa-sig)" in result.out
    assert (both / "bundle.json.minisig").is_file() and not (only / "bundle.json.minisig").exists()
    comment = (both / "bundle.json.ecdsa-sig").read_text().splitlines()[2]
    assert comment in (both / "bundle.json.minisig").read_text().splitlines()
    ecdsa_keys.install(keys.trusted_dir.parent / "ecdsa-trusted")
    ecdsa_only = Keys(keys.pub, keys.key, keys.trusted_dir.parent / "ecdsa-trusted", "")
    shown = verify(only, ecdsa_only, "--json")
    assert shown.code == 0, shown.err
    assert shown.json()["signedBy"]["signatures"] == ["ecdsa-p256-sha256"]
    refused = verify(both, keys, "--json")  # both signatures, the ECDSA key not trusted
    assert refused.json()["error"]["reason"] == "BundleSignedByUnknownKey"
    ecdsa_keys.install(keys.trusted_dir, "factory-fips-test")
    try:
        shown = verify(both, keys, "--json")
        assert shown.code == 0, shown.err
        assert shown.json()["signedBy"]["signatures"] == ["minisign", "ecdsa-p256-sha256"]
    finally:
        (keys.trusted_dir / "factory-fips-test.pem").unlink()
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )  # fmt: skip
    bad = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_a), "--ecdsa-key", rsa_key,
        "--output", tmp_path / "bad", "--insecure-registry", registry.host,
    )  # fmt: skip
    assert bad.code == 78 and "SigningKeyMalformed" in bad.err, bad.err
    assert not (tmp_path / "bad").exists()  # refused before the output was made


def test_a_bad_target_is_refused_before_anything_is_fetched(keys: Keys, tmp_path: Path) -> None:
    for flag, value, needle in (
        ("--target-selector", "site in (a", "not a label key"),
        ("--target-arch", "amd46", "not an architecture"),
    ):
        err = io.StringIO()
        with redirect_stderr(err), pytest.raises(SystemExit) as exited:
            cli.main(["--config", NO_CONFIG, "bundle", "create", "--image",
                      f"example.com/a@sha256:{'1' * 64}", "--key", str(keys.key),
                      "--output", str(tmp_path / "o"), flag, value])  # fmt: skip
        assert (exited.value.code, needle in err.getvalue()) == (2, True), err.getvalue()
    assert not (tmp_path / "o").exists()


def test_output_that_is_not_empty_is_refused(pushed: Pushed, keys: Keys, tmp_path: Path) -> None:
    for junk in ("lost+found/#12", "notes.txt"):
        (tmp_path / "o" / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "o" / junk).write_text("x")
        result = run_cli(
            "bundle", "create", "--image", pushed.ref(pushed.base_a), "--key", keys.key,
            "--output", tmp_path / "o", "--insecure-registry", pushed.host,
        )  # fmt: skip
        assert result.code == 74, result.err
        assert ("is not empty" if junk.startswith("lost") else "holds notes.txt") in result.err
        (tmp_path / "o" / junk).unlink()


def test_an_empty_lost_and_found_is_ignored_by_create_and_verify(
    pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    """Every ext4 medium has one (docs/bundle-format.md R15)."""
    (tmp_path / "o" / "lost+found").mkdir(parents=True)
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_a), "--key", keys.key,
        "--output", tmp_path / "o", "--insecure-registry", pushed.host,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert verify(tmp_path / "o", keys).code == 0
    (tmp_path / "o" / "lost+found" / "#12").write_text("recovered")
    refused = verify(tmp_path / "o", keys, "--json")
    assert refused.json()["error"]["reason"] == "BundleUnlistedFile"
    assert "inside lost+found" in refused.json()["error"]["message"]


def test_existing_bundle_is_not_overwritten(made: Path, pushed: Pushed, keys: Keys) -> None:
    before = (made / "bundle.json").read_bytes()
    result = run_cli(
        "bundle", "create", "--image", pushed.ref(pushed.base_b), "--key", keys.key,
        "--output", made,
    )  # fmt: skip
    assert result.code == 74
    assert "already holds a bundle" in result.err
    assert (made / "bundle.json").read_bytes() == before


@pytest.fixture
def broken_image(registry: Registry) -> Iterator[tuple[str, Callable[[], None]]]:
    """An image whose layer the registry lost; (reference, restore)."""
    image = TestImage("bundle-test/broken", [LayerSpec(200 * 1024, seed=901)]).build()
    pushed = push(registry.url, image.repository, image)
    hex_digest = image.layers[0].digest.removeprefix("sha256:")
    data = registry.root / f"docker/registry/v2/blobs/sha256/{hex_digest[:2]}/{hex_digest}/data"
    data.unlink()

    def restore() -> None:
        push(registry.url, image.repository, image)

    yield pushed.reference(registry.host), restore
    restore()


def test_interrupted_create_leaves_no_bundle_and_resumes(
    registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path,
    broken_image: tuple[str, Callable[[], None]],
) -> None:  # fmt: skip
    ref, restore = broken_image
    output = tmp_path / "o"
    args = ("bundle", "create", "--image", pushed.ref(pushed.base_a), ref, "--key", keys.key,
            "--output", output, "--insecure-registry", registry.host)  # fmt: skip
    failed = run_cli(*args)
    assert failed.code != 0
    assert "ImageNotFound" in failed.err or "RegistryUnavailable" in failed.err
    assert not (output / "bundle.json").exists()
    assert not (output / "bundle.json.minisig").exists()
    assert not [p for p in (output / "blobs" / "sha256").iterdir() if p.name.startswith(".")]
    kept = {p.name: p.stat().st_ino for p in (output / "blobs" / "sha256").iterdir()}
    assert blob(output, pushed.base_a.layer_digests[0]).name in kept

    restore()
    resumed = run_cli(*args)
    assert resumed.code == 0, resumed.err
    for name, inode in kept.items():  # fetched before the failure: kept, not fetched again
        assert (output / "blobs" / "sha256" / name).stat().st_ino == inode
    assert verify(output, keys).code == 0


# ---------------------------------------------------------------- credentials


@pytest.fixture(scope="module")
def basic_registry(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry
) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("basic-registry")
    with Registry(workdir, htpasswd_users={"alice": "s3cret"}, storage_root=registry.root) as reg:
        yield reg


def test_create_with_an_auth_file(
    basic_registry: Registry, pushed: Pushed, keys: Keys, tmp_path: Path
) -> None:
    ref = pushed.base_b.reference(basic_registry.host)
    base = ("bundle", "create", "--image", ref, "--key", keys.key,
            "--insecure-registry", basic_registry.host)  # fmt: skip
    anonymous = run_cli(*base, "--output", tmp_path / "anonymous")
    assert anonymous.code == 1
    assert "RegistryAuthFailed" in anonymous.err
    auth = base64.b64encode(b"alice:s3cret").decode()
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"auths": {basic_registry.host: {"auth": auth}}}))
    result = run_cli(*base, "--output", tmp_path / "o", "--auth-file", auth_file)
    assert result.code == 0, result.err
    assert "s3cret" not in result.out + result.err
    assert verify(tmp_path / "o", keys).code == 0


# ---------------------------------------------------------------- fetch_to and redirects


@dataclass
class Hop:
    """A tiny HTTP server that answers every GET with a redirect (or a basic-auth challenge)."""

    location: Callable[[str], str]
    wants_basic: bool = False
    seen_authorization: list[str | None] | None = None

    def __post_init__(self) -> None:
        hop = self
        self.seen_authorization = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                authorization = self.headers.get("Authorization")
                assert hop.seen_authorization is not None
                hop.seen_authorization.append(authorization)
                if hop.wants_basic and authorization is None:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="hop"')
                else:
                    self.send_response(307)
                    self.send_header("Location", hop.location(self.path))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def hops() -> Iterator[list[Hop]]:
    started: list[Hop] = []
    yield started
    for hop in started:
        hop.close()


def _start(hops: list[Hop], hop: Hop) -> Hop:
    hops.append(hop)
    return hop


def _client(*hosts: str) -> RegistryClient:
    return RegistryClient(insecure=set(hosts), timeout_s=10.0)


async def test_fetch_follows_redirects_without_leaking_credentials(
    registry: Registry, pushed: Pushed, hops: list[Hop]
) -> None:
    storage = _start(hops, Hop(lambda path: f"{registry.url}{path}"))
    front = _start(hops, Hop(lambda path: f"http://{storage.host}{path}", wants_basic=True))
    ref = pushed.base_a.reference(front.host)
    layer = pushed.base_a.layer_digests[1]
    target = io.BytesIO()
    credentials = parse_auth_file(
        json.dumps({"auths": {front.host: {"username": "bob", "password": "pw"}}}), source="t"
    ).credentials_for(ref)
    fetched = await _client(front.host, storage.host).fetch_to(
        ref, layer, target, credentials, max_bytes=1 << 20
    )
    assert fetched.digest == layer
    assert fetched.size_bytes == len(target.getvalue())
    assert blob_digest(target.getvalue()) == layer
    assert front.seen_authorization == [None, "Basic " + base64.b64encode(b"bob:pw").decode()]
    assert storage.seen_authorization == [None]  # another host: no credentials


def blob_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def test_fetch_refuses_content_that_is_not_the_digest(
    registry: Registry, pushed: Pushed, hops: list[Hop]
) -> None:
    wanted, served = pushed.base_a.layer_digests[1], pushed.base_b.layer_digests[1]
    swap = _start(hops, Hop(lambda _: f"{registry.url}/v2/nodeagent-test/app-b/blobs/{served}"))
    ref = pushed.base_a.reference(swap.host)
    with pytest.raises(RegistryUnavailable, match=f"is not {wanted}"):
        await _client(swap.host).fetch_to(ref, wanted, io.BytesIO(), max_bytes=1 << 20)


async def test_fetch_stops_at_max_bytes(registry: Registry, pushed: Pushed) -> None:
    layer = pushed.base_a.layer_digests[0]  # 256 KiB of content, compressed a little
    target = io.BytesIO()
    with pytest.raises(RegistryUnavailable, match=r"Content-Length\).*more than the 1000 allowed"):
        await _client(registry.host).fetch_to(
            pushed.ref(pushed.base_a), layer, target, max_bytes=1000
        )
    assert target.getvalue() == b""  # refused by its Content-Length, before any byte


async def test_fetch_gives_up_after_five_redirects(pushed: Pushed, hops: list[Hop]) -> None:
    loop = _start(hops, Hop(lambda path: path))  # relative: to itself
    with pytest.raises(RegistryUnavailable, match="more than 5 redirects"):
        await _client(loop.host).fetch_to(
            pushed.base_a.reference(loop.host), pushed.base_a.digest, io.BytesIO(), max_bytes=10
        )
    assert loop.seen_authorization is not None
    assert len(loop.seen_authorization) == 6
