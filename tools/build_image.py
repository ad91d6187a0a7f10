"""Build nodeagent's container image (``make image``): an OCI layout, no registry, no base image.

    python tools/build_image.py [--output build/image] [--archive]
                                [--sign-key KEY.pem [--sequence N]]

The image is assembled here from three layers, each a tar written by this tool in a fixed
order with fixed owners and clamped times, gzip'ed with no name and no time
(docs/decisions/0070-the-container-image-and-its-storage.md):

1. **base**: a Debian root made with ``debootstrap --variant=minbase`` and only what nodeagent
   needs at run time (Python 3.11, libudev for pyudev; util-linux's nsenter for the host
   tools, ``/usr/libexec/nodeagent/host-tool``), pruned of documentation (each package's
   copyright file stays), caches, logs and byte code, with the files debootstrap stamps with
   the build's date normalized. Its times are clamped to ``BASE_EPOCH``, not to the commit's:
   the layer changes only with Debian's packages, so an agent update in a bundle adds only
   the two small layers to a node's store. Cached as a plain tar under
   ``~/.cache/nodeagent-testenv/image-root-<key>.tar`` (about 2 minutes to make).
2. **vendor**: the wheels locked in packaging/bundled-requirements.txt (the same wheelhouse
   as the RPM's nodeagent-bundled-deps), installed into /usr/lib/nodeagent/vendor.
3. **nodeagent**: the project's wheel built from the files git tracks, installed into
   /usr/lib/nodeagent/site-packages, the launcher /usr/bin/nodeagent (as the RPM's), the
   host tool wrappers and the journal catalog, with times clamped to ``SOURCE_DATE_EPOCH``
   (default: the last commit's time).

No byte code is shipped for nodeagent's own files either: Python's marshal output is not
reproducible in every case, and the root is read-only (``PYTHONDONTWRITEBYTECODE``).

The result: ``<output>/`` is an OCI image layout (``index.json`` names the manifest with
``org.opencontainers.image.ref.name`` = ``localhost/nodeagent:<version>``) and, with ``--archive``,
``<output>/nodeagent-<version>.oci.tar``, the same layout as one tar (what a stick carries,
``podman load`` and ``skopeo copy oci-archive:`` read it); with ``--sign-key``, also its
signed statement (``.statement``, ``.statement.sig``, with the sequence that orders images:
decisions 0071 and 0074). The digest is printed last. Two builds of the same commit from
empty caches give the same digest (``make image-twice``), as long as Debian's archive served
the same packages.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from build_rpm import CACHE_ROOT, source_files, wheelhouse  # noqa: E402

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES: tuple[str, ...] = ("python3", "libudev1")
BASE_EPOCH = 1735689600
"""2025-01-01T00:00:00Z: the base layer's clamp, independent of nodeagent's commits."""
APP_DIR = "usr/lib/nodeagent"
LAUNCHER = """#!/usr/bin/python3 -I
\"\"\"nodeagent: its own code, then its bundled modules, come first on the path.\"\"\"
import sys

sys.path[:0] = ["/usr/lib/nodeagent/site-packages", "/usr/lib/nodeagent/vendor"]
from nodeagent.cli.main import main

sys.exit(main())
"""
HOST_TOOL = """#!/bin/sh
# nodeagent (container): run a tool of the host (bootc, rpm-ostree) in the host's mount
# namespace; the container runs with --pid=host, so PID 1 is the host's systemd. A host
# without the tool: exit 127, as a shell does for a command it cannot find.
# PID 1 in this container's own mount namespace (not run with --pid=host): no host to reach,
# and nsenter would only run this wrapper again.
tool="/usr/bin/$(basename "$0")"
[ "$(readlink /proc/1/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] || exit 127
[ -x "/proc/1/root$tool" ] || exit 127
exec nsenter --target 1 --mount -- "$tool" "$@"
"""
HOST_TOOLS = ("bootc", "rpm-ostree")
PRUNED = (
    "dev",
    "proc",
    "sys",
    "run",
    "tmp",
    "var/tmp",
    "var/cache",
    "var/log",
    "var/lib/apt/lists",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "etc/hostname",
    "etc/resolv.conf",
    "etc/machine-id",
)
"""Emptied (directories) or removed (files) in the base root."""
EMPTY_DIRS = ("dev", "proc", "sys", "run", "tmp", "var/tmp", "var/cache", "var/log")
REF_NAME = "org.opencontainers.image.ref.name"
REPOSITORY = "localhost/nodeagent"
"""The name ``podman load`` gives the image; the unit runs it by digest (``REPOSITORY@sha256:``)."""


@dataclass(frozen=True)
class Layer:
    blob: bytes
    """The gzip'ed tar."""
    diff_id: str
    """sha256 of the uncompressed tar (the image config's rootfs.diff_ids)."""

    @property
    def digest(self) -> str:
        return sha256(self.blob)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def source_date_epoch() -> int:
    """``SOURCE_DATE_EPOCH`` or the last commit's time."""
    if value := os.environ.get("SOURCE_DATE_EPOCH"):
        return int(value)
    out = subprocess.run(
        ["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return int(out.strip())


# ---------------------------------------------------------------- layers
def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root`` (not ``root``), parents before children, names sorted."""
    for entry in sorted(root.iterdir(), key=lambda p: p.name.encode()):
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)


def layer_tar(root: Path, epoch: int) -> bytes:
    """The tree under ``root`` as a tar: sorted, numeric owners, times clamped to ``epoch``,
    hard links kept, no extended attributes nor device nodes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in _walk(root):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            if info.ischr() or info.isblk() or info.isfifo():
                continue
            info.mtime = min(int(info.mtime), epoch)
            info.uname = info.gname = ""
            if info.isfile():
                with path.open("rb") as stream:
                    tar.addfile(info, stream)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def make_layer(root: Path, epoch: int) -> Layer:
    raw = layer_tar(root, epoch)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(raw)
    return Layer(blob=out.getvalue(), diff_id=sha256(raw))


# ---------------------------------------------------------------- base root
def base_key() -> str:
    text = "\n".join([SUITE, MIRROR, "minbase", *BASE_PACKAGES, *PRUNED, HOST_TOOL])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _prune(root: Path) -> None:
    for name in PRUNED:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for name in EMPTY_DIRS:
        (root / name).mkdir(mode=0o755, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)
    docs = root / "usr/share/doc"
    for path in sorted(docs.rglob("*"), reverse=True):
        if path.name == "copyright" or (path.is_dir() and any(path.iterdir())):
            continue
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    for cache in sorted(root.rglob("__pycache__")):
        shutil.rmtree(cache)
    for old in sorted((root / "var/lib/dpkg").glob("*-old")):
        old.unlink()


def _normalize(root: Path) -> None:
    """Files whose bytes carry the day debootstrap ran: shadow(5)'s "last change" field."""
    day = str(BASE_EPOCH // 86400)
    for name in ("etc/shadow", "etc/shadow-"):
        path = root / name
        if not path.exists():
            continue
        lines = []
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2]:
                fields[2] = day
            lines.append(":".join(fields))
        path.write_text("\n".join(lines) + "\n")
    (root / "etc/machine-id").write_text("")  # systemd's "uninitialized"; podman mounts its own


def _add_host_tools(root: Path) -> None:
    libexec = root / "usr/libexec/nodeagent"
    libexec.mkdir(parents=True, exist_ok=True)
    tool = libexec / "host-tool"
    tool.write_text(HOST_TOOL)
    tool.chmod(0o755)
    for name in HOST_TOOLS:
        link = root / "usr/bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to("../libexec/nodeagent/host-tool")


def _unmount_under(root: Path) -> None:
    """Unmount what is mounted under ``root`` (deepest first) before it is removed."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{root}/")]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


def base_root_tar(cache: Path) -> Path:
    """The pruned Debian root as a plain tar, made once per package list."""
    tarball = cache / f"image-root-{SUITE}-{base_key()}.tar"
    if tarball.exists():
        return tarball
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="image-root.") as work:
        root = Path(work) / "root"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
        done = subprocess.run(
            [*cmd, SUITE, str(root), MIRROR], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            _unmount_under(root)  # a failed debootstrap may leave /proc mounted in the root
            raise SystemExit(f"debootstrap failed ({done.returncode}):\n{done.stdout[-4000:]}")
        _prune(root)
        _normalize(root)
        _add_host_tools(root)
        partial = tarball.with_suffix(".partial")
        subprocess.run(
            ["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True
        )
        partial.rename(tarball)
    return tarball


# ---------------------------------------------------------------- nodeagent's layers
def _pip_install(target: Path, *wheels: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    cmd += ["--no-compile", "--no-warn-script-location", "--target", str(target)]
    subprocess.run([*cmd, *map(str, wheels)], check=True)
    shutil.rmtree(target / "bin", ignore_errors=True)
    for direct in target.glob("*.dist-info/direct_url.json"):
        direct.unlink()
    for record in target.glob("*.dist-info/RECORD"):  # pip writes its lines in any order,
        lines = record.read_text().splitlines(keepends=True)  # and names the removed file
        kept = [line for line in lines if "/direct_url.json," not in line]
        record.write_text("".join(sorted(kept)))
    for cache in sorted(target.rglob("__pycache__")):
        shutil.rmtree(cache)


def vendor_tree(work: Path) -> Path:
    root = work / "vendor"
    _pip_install(root / APP_DIR / "vendor", *sorted(wheelhouse().glob("*.whl")))
    return root


def nodeagent_tree(work: Path) -> Path:
    """nodeagent's wheel from the tracked files (as rpmbuild makes it), installed."""
    source = work / "source"
    for name in source_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    wheels = work / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "--no-index", "--wheel-dir", str(wheels), str(source)], check=True)
    root = work / "app"
    _pip_install(root / APP_DIR / "site-packages", *sorted(wheels.glob("nodeagent-*.whl")))
    launcher = root / "usr/bin/nodeagent"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    catalog = root / "usr/lib/systemd/catalog/nodeagent.catalog"
    catalog.parent.mkdir(parents=True)
    shutil.copyfile(ROOT / "systemd/nodeagent.catalog", catalog)
    for path in [root, *_walk(root)]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path == launcher else 0o644)
    return root


# ---------------------------------------------------------------- the image
def image_config(layers: list[Layer], epoch: int, version: str) -> dict[str, object]:
    created = _rfc3339(epoch)
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": ["/usr/bin/nodeagent"],
            "Cmd": ["run"],
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                "PYTHONDONTWRITEBYTECODE=1",
                "MALLOC_ARENA_MAX=2",
                "PYTHONOPTIMIZE=2",
            ],
            "Labels": {
                "org.opencontainers.image.title": "nodeagent",
                "org.opencontainers.image.version": version,
            },
            "StopSignal": "SIGTERM",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": created, "created_by": f"tools/build_image.py: {name}"}
            for name in ("base", "vendor", "nodeagent")
        ],
    }


def _rfc3339(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_layout(output: Path, layers: list[Layer], config: bytes, version: str) -> str:
    """The OCI layout in ``output`` (replaced); returns the manifest's digest."""
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer.digest,
                    "size": len(layer.blob),
                }
                for layer in layers
            ],
        }
    )
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": sha256(manifest),
                    "size": len(manifest),
                    "annotations": {REF_NAME: f"{REPOSITORY}:{version}"},
                }
            ],
        }
    )
    shutil.rmtree(output, ignore_errors=True)
    blobs = output / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for data in [*(layer.blob for layer in layers), config, manifest]:
        (blobs / sha256(data).removeprefix("sha256:")).write_bytes(data)
    (output / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    (output / "index.json").write_bytes(index)
    return sha256(manifest)


def write_archive(layout: Path, target: Path, epoch: int) -> None:
    """The layout as one tar (``oci-archive:``), as reproducible as its layers."""
    names = sorted(p.relative_to(layout).as_posix() for p in layout.rglob("*") if p.is_file())
    names = [n for n in names if not n.endswith(".oci.tar")]
    with tarfile.open(target, "w", format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = (layout / name).stat().st_size
            info.mtime, info.mode = epoch, 0o644
            with (layout / name).open("rb") as stream:
                tar.addfile(info, stream)


STATEMENT_HEADER = "nodeagent-image-statement-v2"
"""The first line of what an agent image key signs (decisions 0071, 0074)."""
MAX_SEQUENCE = 2**53 - 1
"""A sequence is a JSON-safe integer, as a bundle's (docs/bundle-format.md)."""


def statement(archive: Path | None, digest: str, sequence: int, version: str) -> bytes:
    """What the image's signature covers: the manifest it holds, its place in the order
    images are accepted in (``sequence``: a node never loads one lower than it has), its
    version, and for a stick's archive the archive's bytes (systemd/container/
    nodeagent-image-load checks each; the daemon, for an image a bundle carries, all but
    the archive: the bundle's blobs are checked against the manifest digest)."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ValueError(f"sequence {sequence} is not in 0..2^53-1")
    lines = [STATEMENT_HEADER, f"manifest-digest={digest}", f"sequence={sequence}"]
    lines.append(f"version={version}")
    if archive is not None:
        archive_sum = hashlib.sha256(archive.read_bytes()).hexdigest()
        lines += [f"archive-sha256={archive_sum}", f"archive={archive.name}"]
    return ("\n".join(lines) + "\n").encode()


def sign_statement(target: Path, text: bytes, key: Path) -> Path:
    """``target`` holding ``text`` and its raw Ed25519 signature ``<target>.sig``, made with
    openssl (the tool that checks it on the node); returns ``target``."""
    target.write_bytes(text)
    cmd = ["openssl", "pkeyutl", "-sign", "-inkey", str(key), "-rawin", "-in", str(target)]
    subprocess.run([*cmd, "-out", f"{target}.sig"], check=True)
    return target


def sign_archive(
    archive: Path, digest: str, key: Path, *, sequence: int | None = None, version: str = ""
) -> Path:
    """``<archive>.statement`` and its signature ``.statement.sig``; the sequence defaults
    to ``SOURCE_DATE_EPOCH`` (the commit's time: later commits, higher sequences)."""
    target = archive.with_name(archive.name.removesuffix(".oci.tar") + ".statement")
    seq = source_date_epoch() if sequence is None else sequence
    text = statement(archive, digest, seq, version or project_version())
    return sign_statement(target, text, key)


def build(
    output: Path, *, archive: bool, sign_key: Path | None = None, sequence: int | None = None
) -> str:
    version = project_version()
    epoch = source_date_epoch()
    with tempfile.TemporaryDirectory(prefix="nodeagent-image.") as tmp:
        work = Path(tmp)
        base = work / "base"
        base.mkdir()
        subprocess.run(
            ["tar", "-C", str(base), "--numeric-owner", "-xf", str(base_root_tar(CACHE_ROOT))],
            check=True,
        )
        layers = [make_layer(base, BASE_EPOCH)]
        layers.append(make_layer(vendor_tree(work), epoch))
        layers.append(make_layer(nodeagent_tree(work), epoch))
    config = canonical_json(image_config(layers, epoch, version))
    digest = write_layout(output, layers, config, version)
    if archive or sign_key is not None:
        tar = output / f"nodeagent-{version}.oci.tar"
        write_archive(output, tar, epoch)
        if sign_key is not None:
            sign_archive(tar, digest, sign_key, sequence=sequence, version=version)
    sizes = ", ".join(f"{len(layer.blob) / 1e6:.1f}" for layer in layers)
    print(f"layers (MB, compressed): {sizes}; total {sum(len(x.blob) for x in layers) / 1e6:.1f}")
    print(digest)
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "build" / "image")
    parser.add_argument("--archive", action="store_true", help="also write the layout as a tar")
    parser.add_argument(
        "--sign-key",
        type=Path,
        help="Ed25519 private key (PEM) of the agent image keys: sign the archive",
    )
    parser.add_argument(
        "--sequence",
        type=int,
        help="the signed statement's sequence (default: SOURCE_DATE_EPOCH, the commit's time);"
        " a node never loads an image of a lower sequence than one it has",
    )
    args = parser.parse_args(argv)
    build(
        args.output.resolve(), archive=args.archive, sign_key=args.sign_key, sequence=args.sequence
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
