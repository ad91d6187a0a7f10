"""A synthetic OpenShift release in the test registry, and release signatures made with gpg.

`push_release(registry_url, host, work, version=..., payload_count=...)` pushes:

* `payload_count` payload images `ocp/payload-<i>`, each a multi-arch OCI index (amd64 and
  arm64 children of one small layer);
* per architecture, a release image `ocp/release` whose top layer is a gzip'ed tar holding
  `release-manifests/image-references` (an ImageStream naming every payload by digest,
  the shape `oc adm release new` writes) and `release-manifests/release-metadata`
  (`{"kind": "cincinnati-metadata-v0", "version": ...}`), over a base layer of other
  files; then an OCI index over them (a multi-arch release), tagged with the version;
* with `os_image=True`, the OS image payloads as OpenShift names them in image-references
  (the machine-config-operator's `install/image-references`: `rhel-coreos`, the OS image the
  machine-config daemon rebases to, and `rhel-coreos-extensions`), `ocp/rhel-coreos` and
  `ocp/rhel-coreos-extensions`, multi-arch indexes like the other payloads, whose configs carry
  the labels of a bootable image (`ostree.bootable`, `containers.bootc`). They hold no ostree
  commit: what is tested is how the image is found and read (podman, skopeo, the image proxy),
  not rpm-ostree deploying it (docs/runtime-facts.md, "The OS image").

`TestGpg(home)` makes an ed25519 key in a temporary GNUPGHOME with Debian's gpg and signs
the release digest as the cluster-version operator expects: an OpenPGP signed message
holding an "atomic container signature" JSON document whose
`critical.image.docker-manifest-digest` is the release digest (docs/runtime-facts.md).
`verify_signature` checks one with `gpgv` against the exported public key alone and
returns the signed document. Nothing is fetched from outside.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.testenv.images import (
    BuiltImage,
    GeneratedLayer,
    LayerSpec,
    TestImage,
    assemble_image,
    build_index,
    generate_layer,
    push,
)

ARCHITECTURES = ("amd64", "arm64")
RELEASE_REPOSITORY = "ocp/release"
OS_IMAGE_TAG = "rhel-coreos"
"""The image-references tag of the OS image (machine-config-operator install/image-references)."""
OS_EXTENSIONS_TAG = "rhel-coreos-extensions"
OS_IMAGE_LABELS = {"ostree.bootable": "true", "containers.bootc": "1"}


@dataclass(frozen=True)
class SyntheticRelease:
    host: str
    version: str
    digest: str
    """The index's (the multi-arch release's) digest: what is signed and upgraded to."""
    children: dict[str, str]
    """Architecture → that architecture's release image digest."""
    payload: dict[str, str]
    """Component name → pull spec by digest."""
    os_image_index: dict[str, str] | None = None
    """With `os_image=True`: architecture → the OS image's manifest digest in its index."""
    os_image_configs: dict[str, str] | None = None
    """With `os_image=True`: architecture → the OS image's config digest (its image ID)."""

    @property
    def ref(self) -> str:
        return f"{self.host}/{RELEASE_REPOSITORY}@{self.digest}"

    @property
    def os_image(self) -> str:
        """The `rhel-coreos` pull spec by digest: the osImageURL the MCO renders from it."""
        return self.payload[OS_IMAGE_TAG]


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def files_layer(files: dict[str, bytes], directory: Path) -> GeneratedLayer:
    """A gzip'ed tar layer of `files` (in this order), written into `directory`."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            _tar_member(tar, name, data)
    uncompressed = raw.getvalue()
    compressed = gzip.compress(uncompressed, compresslevel=1, mtime=0)
    digest = "sha256:" + hashlib.sha256(compressed).hexdigest()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / digest.removeprefix("sha256:")
    path.write_bytes(compressed)
    diff_id = "sha256:" + hashlib.sha256(uncompressed).hexdigest()
    spec = LayerSpec(len(compressed), 0)
    return GeneratedLayer(spec, digest, diff_id, len(compressed), path)


def image_of_layers(
    repository: str,
    architecture: str,
    layers: Sequence[GeneratedLayer],
    labels: dict[str, str] | None = None,
) -> BuiltImage:
    platform = {"architecture": architecture, "os": "linux"}
    return assemble_image(repository, None, platform, tuple(layers), labels)


def push_os_images(
    registry_url: str, host: str, cache_dir: Path | None, layer_bytes: int
) -> tuple[dict[str, str], list[BuiltImage]]:
    """Push `rhel-coreos` and `rhel-coreos-extensions`: name → pull spec by digest, and the
    OS image's images (one per architecture)."""
    payload: dict[str, str] = {}
    children: list[BuiltImage] = []
    for number, tag in enumerate((OS_IMAGE_TAG, OS_EXTENSIONS_TAG)):
        repository = f"ocp/{tag}"
        images = [
            image_of_layers(repository, arch, [generate_layer(
                LayerSpec(layer_bytes, 8_000 + number * 4 + n), cache_dir)], OS_IMAGE_LABELS)
            for n, arch in enumerate(ARCHITECTURES)
        ]  # fmt: skip
        payload[tag] = push(registry_url, repository, build_index(images)).reference(host)
        if tag == OS_IMAGE_TAG:
            children = images
    return payload, children


def image_references(version: str, payload: dict[str, str]) -> bytes:
    tags = [
        {"name": name, "annotations": {"io.openshift.build.version": version},
         "from": {"kind": "DockerImage", "name": ref}}
        for name, ref in payload.items()
    ]  # fmt: skip
    doc = {
        "kind": "ImageStream",
        "apiVersion": "image.openshift.io/v1",
        "metadata": {"name": version, "creationTimestamp": None},
        "spec": {"lookupPolicy": {"local": False}, "tags": tags},
    }
    return json.dumps(doc, indent=2).encode()


def push_release(
    registry_url: str,
    host: str,
    work: Path,
    *,
    version: str,
    payload_count: int,
    cache_dir: Path | None = None,
    layer_bytes: int = 2048,
    os_image: bool = False,
    previous: Sequence[str] | None = None,
) -> SyntheticRelease:
    """Push `payload_count` payload images (and the OS images with `os_image`) and a
    multi-arch release naming them."""
    payload: dict[str, str] = {}
    for index in range(payload_count):
        name = f"component-{index:03d}"
        platforms = [
            TestImage(f"ocp/payload-{index:03d}", [LayerSpec(layer_bytes, 7_000 + index * 4 + n)],
                      architecture=arch).build(cache_dir)
            for n, arch in enumerate(ARCHITECTURES)
        ]  # fmt: skip
        one = push(registry_url, f"ocp/payload-{index:03d}", build_index(platforms))
        payload[name] = one.reference(host)
    os_index: dict[str, str] | None = None
    os_configs: dict[str, str] | None = None
    if os_image:
        os_payload, os_children = push_os_images(registry_url, host, cache_dir, layer_bytes)
        payload.update(os_payload)
        os_index = {i.platform["architecture"]: i.digest for i in os_children}
        os_configs = {i.platform["architecture"]: i.config.digest for i in os_children}
    digest, by_arch = push_release_image(
        registry_url, work, version=version, payload=payload, cache_dir=cache_dir,
        previous=previous,
    )  # fmt: skip
    return SyntheticRelease(host, version, digest, by_arch, payload, os_index, os_configs)


def push_release_image(
    registry_url: str,
    work: Path,
    *,
    version: str,
    payload: dict[str, str],
    cache_dir: Path | None = None,
    previous: Sequence[str] | None = None,
) -> tuple[str, dict[str, str]]:
    """Push the multi-arch release image naming ``payload`` (component → pull spec by
    digest): the index's digest, and architecture → that architecture's image digest."""
    cincinnati: dict[str, Any] = {"kind": "cincinnati-metadata-v0", "version": version}
    if previous is not None:
        cincinnati["previous"] = list(previous)  # the versions it upgrades from
    metadata = json.dumps(cincinnati).encode()
    files = {
        "release-manifests/0000_00_cvo_namespace.yaml": b"kind: Namespace\n",
        "release-manifests/image-references": image_references(version, payload),
        "release-manifests/release-metadata": metadata,
    }
    top = files_layer(files, work / "layers")
    base = generate_layer(LayerSpec(4096, 6_999), cache_dir)
    images = [image_of_layers(RELEASE_REPOSITORY, arch, [base, top]) for arch in ARCHITECTURES]
    pushed = push(registry_url, RELEASE_REPOSITORY, build_index(images), tag=f"{version}-multi")
    by_arch = {arch: image.digest for arch, image in zip(ARCHITECTURES, images, strict=True)}
    return pushed.digest, by_arch


# ---------------------------------------------------------------- signatures
def signature_document(release: SyntheticRelease) -> bytes:
    """The "atomic container signature" the CVO verifies (containers/image's simple signing)."""
    doc: dict[str, Any] = {
        "critical": {
            "identity": {
                "docker-reference": f"{release.host}/{RELEASE_REPOSITORY}:{release.version}"
            },
            "image": {"docker-manifest-digest": release.digest},
            "type": "atomic container signature",
        },
        "optional": {"creator": "nodeagent test release", "timestamp": 1767225600},
    }
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class TestGpg:
    """A throw-away GnuPG home with one signing key."""

    __test__ = False

    home: Path
    public_keyring: Path

    @classmethod
    def make(cls, home: Path) -> TestGpg:
        if shutil.which("gpg") is None or shutil.which("gpgv") is None:
            raise RuntimeError("gpg and gpgv are needed (Debian packages gnupg and gpgv)")
        home.mkdir(mode=0o700, parents=True)
        run_gpg(
            home,
            "--quick-gen-key",
            "Test Release <release@test.invalid>",
            "ed25519",
            "sign",
            "never",
        )
        keyring = home / "public.gpg"
        keyring.write_bytes(run_gpg(home, "--export", "release@test.invalid"))
        return cls(home, keyring)

    def sign(self, data: bytes) -> bytes:
        """An OpenPGP signed message (binary, not detached) holding `data`."""
        return run_gpg(self.home, "--sign", "--local-user", "release@test.invalid", stdin=data)

    def close(self) -> None:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=_env(self.home), check=False,
                       capture_output=True)  # fmt: skip


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "GNUPGHOME": str(home)}


def run_gpg(home: Path, *args: str, stdin: bytes = b"") -> bytes:
    command = ["gpg", "--batch", "--yes", "--no-tty", "--pinentry-mode", "loopback",
               "--passphrase", "", *args]  # fmt: skip
    done = subprocess.run(command, input=stdin, env=_env(home), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gpg {args[0]} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout


def write_signature_store(directory: Path, digest: str, signatures: Sequence[bytes]) -> Path:
    """The signature store layout: `<directory>/sha256=<hex>/signature-<n>`, n from 1."""
    own = directory / digest.replace(":", "=")
    own.mkdir(parents=True)
    for number, data in enumerate(signatures, start=1):
        (own / f"signature-{number}").write_bytes(data)
    return directory


def verify_signature(signature: bytes, public_keyring: Path, work: Path) -> dict[str, Any]:
    """`gpgv` with only the test key; the signed document, parsed (raises when it fails)."""
    work.mkdir(parents=True, exist_ok=True)
    source, output = work / "signature", work / "signed.json"
    source.write_bytes(signature)
    output.unlink(missing_ok=True)
    done = subprocess.run(
        ["gpgv", "--keyring", str(public_keyring), "--output", str(output), str(source)],
        capture_output=True, check=False, env={**os.environ, "GNUPGHOME": str(work)},
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"gpgv refused the signature: {done.stderr.decode(errors='replace')}")
    document: dict[str, Any] = json.loads(output.read_bytes())
    return document
