"""Pure helpers of bundle creation: references, ids, documents, platform, set files, progress."""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from nodeagent.adapters.bundles.fetcher import (
    Descriptor,
    PlannedImage,
    image_blobs,
    index_child,
    top_descriptor,
)
from nodeagent.adapters.bundles.sigstore import CarriedSignature
from nodeagent.adapters.bundles.writer import (
    check_bundle_id,
    default_bundle_id,
    index_doc,
    manifest_doc,
    resolve_refs,
    set_object,
)
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import minisign, minisign_kdf
from nodeagent.bundles.freshness import Freshness
from nodeagent.bundles.signatures import ImageSignature, signature_tag
from nodeagent.bundles.target import BundleTarget
from nodeagent.cli.bundle_create import (
    load_set_files,
    parse_platform,
    parse_target_selector,
    read_auth,
    read_secret_key,
)
from nodeagent.cli.terminal import TerminalProgress, format_blob_progress
from nodeagent.errors import (
    AuthFileInvalid,
    ImageNotFound,
    ImageReferenceInvalid,
    KeyMalformed,
    SecretKeyLocked,
    SpecInvalid,
)
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.registries import LINUX_ARCHITECTURES, Platform, node_platform
from nodeagent.selectors import parse_selector
from nodeagent.specs import PinnedImageSet, parse_spec_text

D1, D2, D3, D4 = (f"sha256:{c * 64}" for c in "1234")
APP = parse_pinned_image_ref(f"quay.io/acme/app@{D1}")
DB = parse_pinned_image_ref(f"quay.io/acme/db@{D2}")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _set(name: str, *refs: PinnedImageRef, is_persistent: bool = True) -> PinnedImageSet:
    return PinnedImageSet(name, tuple(refs), is_persistent=is_persistent)


def _manifest(
    config: str = D2, layers: tuple[str, ...] = (D3,), media_type: str | None = None
) -> bytes:
    doc: dict[str, object] = {
        "schemaVersion": 2,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config,
            "size": 10,
        },
        "layers": [{"mediaType": "x", "digest": d, "size": 100 + i} for i, d in enumerate(layers)],
    }
    if media_type:
        doc["mediaType"] = media_type
    return json.dumps(doc).encode()


def _index(*entries: tuple[str, str, str]) -> bytes:
    manifests = [
        {
            "mediaType": OCI_MANIFEST,
            "digest": d,
            "size": 500,
            "platform": {"os": "linux", "architecture": a, **({"variant": v} if v else {})},
        }
        for d, a, v in entries
    ]
    return json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()


# ---------------------------------------------------------------- references


def test_refs_keep_order_and_add_the_sets_images_once() -> None:
    refs = resolve_refs([str(APP), f" {APP} "], [_set("s", DB, APP)])
    assert refs == [APP, DB]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("quay.io/acme/app:latest", "tag reference"),
        ("quay.io/acme/app", "has no digest"),
        (f"app@{D1}", "no registry host"),
    ],
)
def test_refs_must_be_digest_references(text: str, problem: str) -> None:
    with pytest.raises(ImageReferenceInvalid, match=problem) as caught:
        resolve_refs([text], [])
    assert caught.value.message.startswith("--image ")
    assert "skopeo inspect" in caught.value.message


def test_no_images_at_all_is_an_error() -> None:
    with pytest.raises(SpecInvalid, match="at least one --image"):
        resolve_refs([], [])


# ---------------------------------------------------------------- ids


@pytest.mark.parametrize("good", ["a", "line-3_2026.11", "x" * 128])
def test_good_bundle_ids(good: str) -> None:
    assert check_bundle_id(good) == good


@pytest.mark.parametrize("bad", ["", "x" * 129, "a/b", "a b", "ü"])
def test_bad_bundle_ids(bad: str) -> None:
    with pytest.raises(SpecInvalid, match="bundle id"):
        check_bundle_id(bad)


def test_default_id_follows_the_content() -> None:
    first = default_bundle_id("amd64", [APP, DB], [{"a": 1}])
    assert first == default_bundle_id("amd64", [DB, APP], [{"a": 1}])  # order does not matter
    assert re.fullmatch(r"bundle-amd64-[0-9a-f]{16}", first)
    assert check_bundle_id(first) == first
    assert first != default_bundle_id("arm64", [APP, DB], [{"a": 1}])
    assert first != default_bundle_id("amd64", [APP], [{"a": 1}])
    assert first != default_bundle_id("amd64", [APP, DB], [{"a": 2}])
    workers = BundleTarget(parse_selector("node-role.kubernetes.io/worker"))
    for_workers = default_bundle_id("amd64", [APP, DB], [{"a": 1}], workers)
    assert for_workers != first
    assert for_workers == default_bundle_id("amd64", [APP, DB], [{"a": 1}], workers)
    assert for_workers != default_bundle_id(
        "amd64", [APP, DB], [{"a": 1}], BundleTarget(parse_selector("site=line-3"))
    )


# ---------------------------------------------------------------- documents


def test_set_object_parses_back_to_the_same_set() -> None:
    original = _set("line-3", APP, DB)
    text = yaml.safe_dump(set_object(original))
    [again] = parse_spec_text(text, source="t", is_persistent=True).sets
    assert (again.name, again.images) == (original.name, original.images)


def test_set_object_keeps_labels() -> None:
    labelled = PinnedImageSet("s", (APP,), labels={"pool": "worker"})
    assert set_object(labelled)["metadata"] == {"name": "s", "labels": {"pool": "worker"}}


def _planned(ref: PinnedImageRef, *layers: Descriptor) -> PlannedImage:
    top = Descriptor(OCI_MANIFEST, ref.digest, 300)
    return PlannedImage(ref, (top,), Descriptor("c", D4, 10), layers)


def test_manifest_doc_parses_and_counts_shared_blobs_once() -> None:
    shared = Descriptor("l", f"sha256:{'a' * 64}", 1000)
    images = [_planned(APP, shared), _planned(DB, shared)]
    files = {"oci-layout": b"{}", "index.json": index_doc(images)}
    sets = [_set("s", APP, is_persistent=False)]
    data = manifest_doc(
        bundle_id="b",
        created="2026-01-01T00:00:00Z",
        architecture="amd64",
        images=images,
        files=files,
        sets=sets,
    )
    manifest = bundle.parse_manifest(data)
    assert [str(i.ref) for i in manifest.images] == [str(APP), str(DB)]
    assert [i.size_bytes for i in manifest.images] == [1310, 1310]
    assert [i.manifest_digest for i in manifest.images] == [D1, D2]
    paths = [f.path for f in manifest.files]
    assert paths.count(bundle.blob_path("oci", shared.digest)) == 1
    assert len(paths) == 4 + 2  # 2 manifests, the shared config and layer; 2 layout files
    assert manifest.total_size_bytes == 300 * 2 + 10 + 1000 + 2 + len(files["index.json"])
    [item] = manifest.sets
    assert (item.is_persistent, item.object) == (False, set_object(sets[0]))
    layout = {f.path: f for f in manifest.files}["oci-layout"]
    assert layout.sha256_hex == hashlib.sha256(b"{}").hexdigest()


def test_manifest_doc_with_a_target_is_format_2_and_reads_back() -> None:
    images = [_planned(APP)]
    files = {"oci-layout": b"{}", "index.json": index_doc(images)}
    target = BundleTarget(parse_selector("site=line-3, node-role.kubernetes.io/worker"))
    common = {"bundle_id": "b", "created": "2026-01-01T00:00:00Z", "architecture": "arm64",
              "images": images, "files": files, "sets": []}  # fmt: skip
    plain = json.loads(manifest_doc(**common))  # type: ignore[arg-type]
    assert (plain["formatVersion"], "target" in plain) == (1, False)
    data = manifest_doc(**common, target=target)  # type: ignore[arg-type]
    doc = json.loads(data)
    assert doc["formatVersion"] == 2
    assert doc["target"] == {"nodeSelector": "node-role.kubernetes.io/worker,site=line-3"}
    assert bundle.parse_manifest(data).target == target


def test_index_doc_names_each_top_manifest_by_reference() -> None:
    doc = json.loads(index_doc([_planned(APP), _planned(DB)]))
    assert doc["mediaType"] == OCI_INDEX
    [first, second] = doc["manifests"]
    assert first == {
        "mediaType": OCI_MANIFEST,
        "digest": D1,
        "size": 300,
        "annotations": {"org.opencontainers.image.ref.name": str(APP)},
    }
    assert second["annotations"]["org.opencontainers.image.ref.name"] == str(DB)


# ---------------------------------------------------------------- manifests


def test_image_blobs_are_config_then_layers() -> None:
    config, *layers = image_blobs(_manifest(layers=(D3, D4)), APP)
    assert (config.digest, config.size_bytes) == (D2, 10)
    assert [(d.digest, d.size_bytes) for d in layers] == [(D3, 100), (D4, 101)]


@pytest.mark.parametrize(
    "bad",
    [{"digest": "sha512:" + "0" * 128, "size": 1}, {"digest": D1, "size": -1}, {"digest": D1}, "x"],
)
def test_descriptors_bundles_cannot_hold_are_refused(bad: object) -> None:
    body = json.dumps({"schemaVersion": 2, "config": bad, "layers": []}).encode()
    with pytest.raises(ImageNotFound, match=r"manifest is malformed: config"):
        image_blobs(body, APP)


@pytest.mark.parametrize(
    ("body", "media_type"),
    [
        (_manifest(), OCI_MANIFEST),
        (
            _manifest(media_type="application/vnd.docker.distribution.manifest.v2+json"),
            "application/vnd.docker.distribution.manifest.v2+json",
        ),
        (_index((D2, "amd64", "")), OCI_INDEX),
    ],
)
def test_top_descriptor_media_type(body: bytes, media_type: str) -> None:
    found = top_descriptor(D1, body, APP)
    assert found == Descriptor(media_type, D1, len(body))


def test_index_child_is_the_platforms_entry() -> None:
    body = _index((D2, "amd64", ""), (D3, "arm64", ""), (D4, "arm", "v7"))
    assert index_child(body, Platform("linux", "arm64"), APP) == Descriptor(OCI_MANIFEST, D3, 500)
    assert index_child(body, Platform("linux", "arm", "v7"), APP).digest == D4  # type: ignore[union-attr]
    assert index_child(_manifest(), Platform("linux", "amd64"), APP) is None
    with pytest.raises(ImageNotFound, match="no linux/s390x image"):
        index_child(body, Platform("linux", "s390x"), APP)


# ---------------------------------------------------------------- CLI input and output


@pytest.mark.parametrize(
    ("text", "platform"),
    [
        ("amd64", Platform("linux", "amd64")),
        ("arm64", Platform("linux", "arm64")),
        ("arm/v7", Platform("linux", "arm", "v7")),
        ("linux/ppc64le", Platform("linux", "ppc64le")),
    ],
)
def test_parse_platform(text: str, platform: Platform) -> None:
    assert parse_platform(text) == platform


@pytest.mark.parametrize(
    "bad", ["", "windows/amd64", "AMD64", "arm/7", "a/b/c/d", "amd46", "x86_64", "aarch64"]
)
def test_parse_platform_refuses(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_platform(bad)


def test_every_machine_name_maps_to_a_known_architecture() -> None:
    for machine in ("x86_64", "aarch64", "armv7l", "i686", "ppc64le", "s390x", "riscv64"):
        assert node_platform(machine).architecture in LINUX_ARCHITECTURES
        assert parse_platform(str(node_platform(machine))) == node_platform(machine)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("site=line-3", "site=line-3"), ("b, a", "a,b"), ("zone in (y, x)", "zone in (x,y)")],
)
def test_target_selector_flag(text: str, canonical: str) -> None:
    assert parse_target_selector(text).selector_text == canonical


@pytest.mark.parametrize("bad", ["", "a=(", "k=" + "v" * 64, "a" * 5000, "\x1b[2J"])
def test_target_selector_flag_refuses(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_target_selector(bad)
    assert "--target-selector" in str(info.value)


def test_terminal_progress_overwrites_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    now_s = [100.0]
    progress = TerminalProgress(clock=lambda: now_s[0])
    progress.blobs(1, 3, 10, 2048)  # the first: shown
    now_s[0] = 100.1
    progress.blobs(1, 3, 15, 2048)  # too soon: skipped
    now_s[0] = 100.25
    progress.blobs(2, 3, 1024, 2048)  # 0.25 s after the first: shown
    progress.blobs(3, 3, 2048, 2048)  # the last: always shown
    progress.hashed(2, 2)  # final, and shorter: padded over the longer line
    progress.close()
    lines = capsys.readouterr().err
    assert lines.split("\r") == [
        "",
        "blobs 1/3, 10 B/2 KiB",
        "blobs 2/3, 1 KiB/2 KiB",
        "blobs 3/3, 2 KiB/2 KiB",
        "hashed 2 B/2 B" + " " * 8 + "\n",
    ]


def test_progress_line() -> None:
    line = format_blob_progress(12, 40, 130 * 2**20, 420 * 2**20)
    assert line == "blobs 12/40, 130 MiB/420 MiB"


SET_TEXT = f"""apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: NAME
spec:
  pinnedImages:
    - name: {APP}
"""


def test_set_files_load_with_their_persistence(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SET_TEXT.replace("NAME", "a"))
    (tmp_path / "b.yaml").write_text(SET_TEXT.replace("NAME", "b"))
    sets = load_set_files([tmp_path / "a.yaml", tmp_path / "b.yaml"], is_persistent=False)
    assert [(s.name, s.is_persistent, s.images) for s in sets] == [
        ("a", False, (APP,)),
        ("b", False, (APP,)),
    ]


@pytest.mark.parametrize(
    ("texts", "problem"),
    [
        (
            [SET_TEXT.replace("NAME", "a").replace("@sha256", ":tag@sha256")],
            "a.yaml: PinnedImageSet 'a'",
        ),
        (["key: [unclosed"], "not valid YAML"),
        (["# nothing here\n"], "holds no PinnedImageSet"),
        ([SET_TEXT.replace("NAME", "a"), SET_TEXT.replace("NAME", "a")], "defined twice"),
    ],
)
def test_bad_set_files_are_refused(tmp_path: Path, texts: list[str], problem: str) -> None:
    paths = []
    for index, text in enumerate(texts):
        paths.append(tmp_path / ("a.yaml" if index == 0 else f"{index}.yaml"))
        paths[-1].write_text(text)
    with pytest.raises(SpecInvalid, match=problem):
        load_set_files(paths, is_persistent=True)


def test_unreadable_set_file(tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="cannot read PinnedImageSet file"):
        load_set_files([tmp_path / "missing.yaml"], is_persistent=True)


# ---------------------------------------------------------------- keys and credentials


def _encrypt(secret_text: str, password: bytes) -> str:
    """An unencrypted minisign secret key re-encrypted the way `minisign -G` does (scrypt)."""
    raw = base64.b64decode(secret_text.splitlines()[1])
    salt, opslimit, memlimit = os.urandom(32), 1 << 20, 1 << 24  # small: a fast test
    n_log2, r, p = minisign_kdf.scrypt_parameters(opslimit, memlimit)
    stream = hashlib.scrypt(password, salt=salt, n=1 << n_log2, r=r, p=p, maxmem=1 << 26, dklen=104)
    body = bytes(a ^ b for a, b in zip(raw[54:], stream, strict=True))
    limits = opslimit.to_bytes(8, "little") + memlimit.to_bytes(8, "little")
    line = base64.b64encode(b"EdScB2" + salt + limits + body).decode()
    return f"untrusted comment: encrypted for a test\n{line}\n"


def test_secret_key_with_a_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    public_text, secret_text = minisign.generate_keypair()
    key = tmp_path / "k.key"
    key.write_text(_encrypt(secret_text, b"hunter2"))
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("hunter2\n")
    bad.write_text("hunter3\n")
    opened = read_secret_key(key, good)
    assert opened.public_key() == minisign.parse_public_key(public_text)
    with pytest.raises(SecretKeyLocked, match="wrong password"):
        read_secret_key(key, bad)
    monkeypatch.setattr("sys.stdin", io.StringIO())  # not a terminal: nobody to ask
    with pytest.raises(SecretKeyLocked, match="give its password"):
        read_secret_key(key, None)
    with pytest.raises(KeyMalformed, match="cannot read the secret key"):
        read_secret_key(tmp_path / "missing.key", None)


def test_auth_file_from_flag_environment_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auths": {"quay.io": {"username": "u", "password": "p"}}}))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    assert len(read_auth(None)) == 0
    found = read_auth(auth).credentials_for(str(APP))
    assert found is not None and found.username == "u"
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    assert len(read_auth(None)) == 1
    with pytest.raises(AuthFileInvalid, match="cannot read"):
        read_auth(tmp_path / "missing.json")


def test_manifest_doc_with_signatures_is_format_3_and_lists_their_blobs() -> None:
    images = [_planned(APP), _planned(DB)]
    files = {"oci-layout": b"{}", "index.json": index_doc(images)}
    top = Descriptor(OCI_MANIFEST, f"sha256:{'7' * 64}", 700)
    payload = Descriptor(
        "application/vnd.dev.cosign.simplesigning.v1+json", f"sha256:{'8' * 64}", 230
    )
    carried = CarriedSignature(
        ImageSignature(APP, signature_tag(APP.digest), top.digest), (top, payload)
    )
    target = BundleTarget(parse_selector("site=line-3"))
    data = manifest_doc(bundle_id="b", created="2026-01-01T00:00:00Z", architecture="amd64",
                        images=images, files=files, sets=[], target=target,
                        freshness=Freshness("default", 7, None), signatures=[carried])  # fmt: skip
    doc = json.loads(data)
    assert doc["formatVersion"] == 3
    assert doc["imageSignatures"] == [
        {"image": str(APP), "tag": signature_tag(APP.digest), "manifest": top.digest}
    ]
    listed = {blob["digest"]: blob["sizeBytes"] for blob in doc["blobs"]}
    assert (listed[top.digest], listed[payload.digest]) == (700, 230)
    parsed = bundle.parse_manifest(data)
    assert parsed.image_signatures == (carried.signature,)
    assert parsed.target == target
    assert [i.size_bytes for i in parsed.images] == [i.size_bytes for i in images]


def test_manifest_doc_refuses_format_3_content_without_a_sequence() -> None:
    with pytest.raises(ValueError, match="needs a sequence"):
        manifest_doc(bundle_id="b", created="2026-01-01T00:00:00Z", architecture="amd64",
                      images=[], files={}, sets=[], signatures=[
                          CarriedSignature(ImageSignature(APP, signature_tag(APP.digest),
                                                          f"sha256:{'7' * 64}"), ())])  # fmt: skip
