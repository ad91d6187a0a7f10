"""Signed test bundles made the way a factory makes them, and media carrying them.

``build_factory`` pushes generated images to a registry of its own, runs ``nodeagent bundle
create`` against it (a real subprocess, signing with a fresh minisign key) and stops that
registry: whoever imports the bundle afterwards has no registry to fall back on.
``ext4_media`` puts a bundle on an ext4 image with a label, ready for ``LoopMedia``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.bundles import minisign
from tests.testenv.agent import pinned_image_set_yaml
from tests.testenv.images import make_image_set, push
from tests.testenv.registry import Registry
from tests.testenv.udev import LoopMedia

LABEL = "NODEAGENT1"


@dataclass(frozen=True)
class Factory:
    """A bundle made from a registry that no longer runs, and the key that signed it."""

    bundle: Path
    public_key: str
    refs: list[str]
    set_name: str


def make_bundle(
    workdir: Path,
    registry: Registry,
    refs: list[str],
    public: str,
    secret: str,
    *,
    extra_args: Sequence[str] = (),
    set_name: str = "line-3",
    bundle_id: str = "line-3-test",
    images: Sequence[str] | None = None,
) -> Path:
    """``bundle create`` of ``refs`` (its set); ``images``: the ``--image`` values when they
    differ from ``refs`` (``host/repo:tag@sha256:…`` with ``--serve-tags``)."""
    key = workdir / "factory.key"
    key.write_text(secret)
    (workdir / "factory.pub").write_text(public)
    spec = workdir / "line-3.yaml"
    spec.write_text(pinned_image_set_yaml(set_name, refs))
    out = workdir / "bundle"
    cmd = [
        sys.executable,
        "-m",
        "nodeagent",
        "--config",
        str(workdir / "none.toml"),
        "bundle",
        "create",
        "--image",
        *(refs if images is None else images),
        "--pinned-image-set",
        str(spec),
        "--key",
        str(key),
        "--output",
        str(out),
        "--insecure-registry",
        registry.host,
        "--id",
        bundle_id,
        *extra_args,
    ]
    made = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    return out


def build_factory(
    workdir: Path,
    *,
    count: int,
    layer_bytes: int,
    seed: int,
    extra_args: Sequence[str] = (),
    bundle_id: str = "line-3-test",
    set_name: str = "line-3",
) -> Factory:
    """Images pushed to a registry that is stopped once the signed bundle of them is made;
    ``extra_args`` go to ``bundle create`` (``--target-selector``)."""
    public, secret = minisign.generate_keypair(comment=f"factory {seed}")
    with Registry(workdir / "registry") as registry:
        images = make_image_set(
            count, layer_size_bytes=layer_bytes, shared_base_size_bytes=2 << 20, seed=seed
        )
        refs = [
            push(registry.url, i.repository, i.build()).reference(registry.host) for i in images
        ]
        bundle = make_bundle(
            workdir, registry, refs, public, secret, extra_args=extra_args,
            bundle_id=bundle_id, set_name=set_name,
        )  # fmt: skip
    return Factory(bundle, public, refs, set_name)


def ext4_media(tmp_path: Path, bundle: Path, label: str = LABEL) -> LoopMedia:
    """An ext4 image labelled ``label`` holding the bundle tree at its root (not attached)."""
    image = tmp_path / "stick.img"
    size_bytes = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    with image.open("wb") as sparse:
        sparse.truncate(max(64 << 20, size_bytes * 2))
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(bundle), str(image)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return LoopMedia(image)
