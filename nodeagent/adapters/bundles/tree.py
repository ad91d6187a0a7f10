"""Check a bundle directory (a mounted medium, or any directory) against its signed manifest.

The order is the trust order of docs/bundle-format.md:

1. ``read_signed_manifest``: read ``bundle.json`` (at most 16 MiB) and its signatures
   (``bundle.json.minisig``, ``bundle.json.ecdsa-sig``), all regular files opened without
   following links, and verify them (``trust.verify_signed``: decision 0075's rule) against
   the trusted keys (``load_trusted_keys_dir``) before a byte of the manifest is parsed;
   then the architecture (``content.check_architecture``);
2. ``walk_tree`` + ``tree_rules.check_tree``: every entry lstat'ed, none followed, checked as
   the walk yields it (memory bounded by the manifest, not by the medium); unlisted,
   unsafe, missing or wrongly sized entries are refused before anything is read;
3. ``check_contents``: every image complete for the platform (``bundles.content``), from
   the manifests, configs and layout files, each read whole (at most 4 MiB) and checked
   against its digest;
4. ``hash_files``: every listed file streamed through sha256 and compared.

``verify_bundle`` runs the four and returns a ``VerifyReport`` (``bundle verify``); the
daemon's import runs the first three (``intake.check_for_import``) and hashes the blobs
as it serves them.
Files are opened with ``BundleDir.open_file``: each path component is opened relative
to the previous one with ``O_NOFOLLOW``, so a link anywhere on the path is refused, not
followed. ``HashingReader`` hashes what passes through it, so a reader that serves blobs
(the daemon's import) checks every byte it hands out with the same rules.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from nodeagent.adapters.bundles.trust import TrustedKeys as TrustedKeys
from nodeagent.adapters.bundles.trust import load_trusted_keys_dir as load_trusted_keys_dir
from nodeagent.adapters.bundles.trust import verify_signed as verify_signed
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.bundles import content, ecdsa_signature, minisign, tree_rules
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.manifest import (
    BundleIncomplete,
    BundleManifest,
    BundleManifestInvalid,
    BundleSizeMismatch,
    BundleUnsafeEntry,
    ExpectedFile,
)
from nodeagent.bundles.signatures import signatures_doc
from nodeagent.bundles.target import target_doc
from nodeagent.bundles.tree_rules import TreeEntry
from nodeagent.errors import HostFileError, NodeAgentError
from nodeagent.registries import Platform
from nodeagent.strict import clip

READ_CHUNK_BYTES = 1 << 20
MAX_SIGNATURE_BYTES = minisign.MAX_SIGNATURE_BYTES
"""The format's bound on a signature file (``bundles.minisign``), re-exported for readers."""

Progress = Callable[[int, int], None]
"""``on_progress(bytes_done, bytes_total)``, called after every chunk hashed."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under a listed name must not hang; fstat then refuses it.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# ---------------------------------------------------------------- opening files safely
FileStamp = tuple[int, int, int, int, int]
"""A file's identity and version: device, inode, size, mtime and ctime (ns). A file replaced
(renamed over) gets another inode, one written in place another mtime and ctime."""


def file_stamp(fd: int) -> FileStamp:
    """The ``FileStamp`` of an open file."""
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class BundleDir:
    """A bundle's root directory, held open; files are opened beneath it, never through links."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise HostFileError(f"cannot open bundle directory {root}: {err.strerror}") from err

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> BundleDir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open_file(self, file: ExpectedFile) -> io.FileIO:
        """Open a listed file for reading; refuse a link, a non-regular file or a wrong size."""
        stream = self._open_regular(file.path)
        size_bytes = os.fstat(stream.fileno()).st_size
        if size_bytes != file.size_bytes:
            stream.close()
            raise BundleSizeMismatch(
                f"{file.path} is {size_bytes} bytes, bundle.json says {file.size_bytes}"
            )
        return stream

    def read_listed(self, file: ExpectedFile) -> bytes:
        """All of a listed file, checked against its size and digest (small files only)."""
        with self.open_file(file) as stream:
            data = _read_bounded(stream, file.path, file.size_bytes + 1)
        if len(data) != file.size_bytes:
            raise BundleSizeMismatch(
                f"{file.path}: read {len(data)} bytes, bundle.json says {file.size_bytes}"
            )
        tree_rules.check_digest(file, hashlib.sha256(data).hexdigest())
        return data

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """All of a small regular file (at most ``max_bytes`` + 1 read), or None when absent."""
        try:
            stream = self._open_regular(path)
        except BundleIncomplete:
            return None
        with stream:
            return _read_bounded(stream, path, max_bytes + 1)

    def read_small_stamped(
        self, path: str, max_bytes: int, *, unless: FileStamp | None = None
    ) -> tuple[FileStamp, bytes | None] | None:
        """``read_small`` with the file's stamp, taken before it is read; the bytes are not
        read (None) when the stamp is ``unless`` (the caller has them). None when absent."""
        try:
            stream = self._open_regular(path)
        except BundleIncomplete:
            return None
        with stream:
            stamp = file_stamp(stream.fileno())
            if stamp == unless:
                return stamp, None
            return stamp, _read_bounded(stream, path, max_bytes + 1)

    def _open_regular(self, path: str) -> io.FileIO:
        *parents, name = bundle.check_relative_path(path).split("/")
        dir_fd = self.fd
        try:
            for part in parents:
                next_fd = _open_at(part, _DIR_FLAGS, dir_fd, path)
                if dir_fd != self.fd:
                    os.close(dir_fd)
                dir_fd = next_fd
            fd = _open_at(name, _FILE_FLAGS, dir_fd, path)
        finally:
            if dir_fd != self.fd:
                os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BundleUnsafeEntry(f"{path} is not a regular file; bundles hold only those")
        return io.FileIO(fd, "rb", closefd=True)


def _open_at(name: str, flags: int, dir_fd: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise BundleIncomplete(f"{path} is missing from the bundle") from None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BundleUnsafeEntry(
                f"{path} is or passes through a symbolic link or a file; bundles hold only "
                "regular files and directories"
            ) from None
        raise HostFileError(f"cannot open {path} in the bundle: {err.strerror}") from err


def _read_bounded(stream: io.FileIO, path: str, limit_bytes: int) -> bytes:
    parts: list[bytes] = []
    size_bytes = 0
    try:
        while size_bytes < limit_bytes and (chunk := stream.read(limit_bytes - size_bytes)):
            parts.append(chunk)
            size_bytes += len(chunk)
    except OSError as err:
        raise HostFileError(f"cannot read {path} in the bundle: {err.strerror}") from err
    return b"".join(parts)


# ---------------------------------------------------------------- 1. the signed manifest
def read_signed_manifest(
    root: Path, trusted_keys: TrustedKeys
) -> tuple[BundleManifest, ecdsa_signature.ManifestVerified]:
    """Read ``bundle.json``, verify its signatures, and only then parse it."""
    manifest, verified, _digest = read_signed(root, trusted_keys)
    return manifest, verified


def read_signed(
    root: Path, trusted_keys: TrustedKeys
) -> tuple[BundleManifest, ecdsa_signature.ManifestVerified, str]:
    """``read_signed_manifest``, and the ``sha256:<hex>`` of the bytes verified."""
    data, minisig, ecdsa = read_signature_files(root)
    verified = verify_signed(data, minisig, ecdsa, trusted_keys)
    return bundle.parse_manifest(data), verified, f"sha256:{hashlib.sha256(data).hexdigest()}"


def read_signature_files(root: Path) -> tuple[bytes, bytes | None, bytes | None]:
    """``bundle.json`` (bounded) and its signature files (each None when absent; read at most
    one byte past their bound, so ``verify_signed`` refuses an oversized one)."""
    with BundleDir(root) as directory:
        data = directory.read_small(bundle.MANIFEST_NAME, bundle.MAX_MANIFEST_BYTES)
        minisig = directory.read_small(bundle.SIGNATURE_NAME, MAX_SIGNATURE_BYTES)
        ecdsa = directory.read_small(
            bundle.ECDSA_SIGNATURE_NAME, ecdsa_signature.MAX_SIGNATURE_BYTES
        )
    if data is None:
        raise BundleIncomplete(
            f"{root} holds no {bundle.MANIFEST_NAME}: it is not a bundle, or it was not "
            "written completely (bundle create writes bundle.json last)"
        )
    if len(data) > bundle.MAX_MANIFEST_BYTES:
        raise BundleManifestInvalid(
            f"{bundle.MANIFEST_NAME} is larger than {bundle.MAX_MANIFEST_BYTES} bytes"
        )
    return data, minisig, ecdsa


# ---------------------------------------------------------------- 2. the tree
def walk_tree(root: Path) -> Generator[TreeEntry, None, None]:
    """Every entry under ``root`` as lstat sees it, paths relative and ``/``-separated.

    Yielded one at a time, a directory's entries before its subdirectories' (no order
    within a directory): the caller refuses an entry before the walk goes on, so an
    unlisted directory is never entered. Close it when stopping early (its directory is
    open meanwhile).
    """
    pending = [""]
    while pending:
        prefix = pending.pop()
        try:
            with os.scandir(root / prefix if prefix else root) as listing:
                for item in listing:
                    entry = _entry(prefix + item.name, item)
                    yield entry
                    if entry.kind == "dir":
                        pending.append(f"{prefix}{item.name}/")
        except OSError as err:
            where = clip(str(root / prefix), 300)
            raise HostFileError(f"cannot list {where}: {err.strerror}") from err


# ---------------------------------------------------------------- 3. the images
def check_contents(root: Path, manifest: BundleManifest, platform: Platform) -> None:
    """Every image complete for ``platform`` (``bundles.content``), reading only small files."""
    with BundleDir(root) as directory:
        content.check_content(manifest, platform, directory.read_listed)
        release_signatures(directory, manifest)


def release_signatures(directory: BundleDir, manifest: BundleManifest) -> dict[str, bytes]:
    """Each signature file of ``manifest.release`` in a bundle (or a bundle's directory in the
    node store), checked against its size and sha256 in the signed manifest (rule R32)."""
    if manifest.release is None:
        return {}
    files = {f.path: f for f in manifest.files}
    return {s.path: directory.read_listed(files[s.path]) for s in manifest.release.signatures}


def check_signed_bundle(root: Path, manifest: BundleManifest, platform: Platform) -> None:
    """After the signature: the architecture, the tree, the images (no blob hashed)."""
    content.check_architecture(manifest, platform)
    with contextlib.closing(walk_tree(root)) as entries:
        tree_rules.check_tree(entries, manifest)
    check_contents(root, manifest, platform)


def _entry(path: str, item: os.DirEntry[str]) -> TreeEntry:
    if item.is_symlink():
        return TreeEntry(path, "symlink")
    if item.is_dir(follow_symlinks=False):
        return TreeEntry(path, "dir")
    if item.is_file(follow_symlinks=False):
        return TreeEntry(path, "file", item.stat(follow_symlinks=False).st_size)
    return TreeEntry(path, "other")


# ---------------------------------------------------------------- 4. every byte
class ReadsInto(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


class HashingReader:
    """Reads a listed file, hashing as it goes; ``finish()`` checks size and digest."""

    def __init__(self, stream: ReadsInto, file: ExpectedFile) -> None:
        self.stream = stream
        self.file = file
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0

    def readinto(self, buffer: memoryview) -> int:
        try:
            count = self.stream.readinto(buffer) or 0
        except OSError as err:
            raise HostFileError(f"cannot read {self.file.path}: {err.strerror}") from err
        self.sha256.update(buffer[:count])
        self.size_bytes += count
        if self.size_bytes > self.file.size_bytes:
            raise BundleSizeMismatch(
                f"{self.file.path}: more than the {self.file.size_bytes} bytes bundle.json says"
            )
        return count

    def read(self, size: int = READ_CHUNK_BYTES) -> bytes:
        buffer = memoryview(bytearray(size))
        return bytes(buffer[: self.readinto(buffer)])

    def finish(self) -> None:
        """Raise unless exactly the listed bytes went through (call at end of file)."""
        if self.size_bytes != self.file.size_bytes:
            raise BundleSizeMismatch(
                f"{self.file.path}: read {self.size_bytes} bytes, bundle.json says "
                f"{self.file.size_bytes} (the file changed while it was read?)"
            )
        tree_rules.check_digest(self.file, self.sha256.hexdigest())


def hash_files(root: Path, manifest: BundleManifest, on_progress: Progress | None = None) -> None:
    """Hash every listed file (1 MiB reads) and compare size and digest; first failure raises."""
    total_bytes, done_bytes = manifest.total_size_bytes, 0
    buffer = memoryview(bytearray(READ_CHUNK_BYTES))
    with BundleDir(root) as directory:
        for file in manifest.files:
            with directory.open_file(file) as stream:
                reader = HashingReader(stream, file)
                while count := reader.readinto(buffer):
                    done_bytes += count
                    if on_progress is not None:
                        on_progress(done_bytes, total_bytes)
                reader.finish()


# ---------------------------------------------------------------- all of it
@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_bundle`` found; ``error`` is None exactly when the bundle is good."""

    path: Path
    is_full: bool
    """Whether every byte was hashed (False: signature and tree only)."""
    seconds: float
    manifest: BundleManifest | None = None
    """Set once the signature verified."""
    verified: ecdsa_signature.ManifestVerified | None = None
    error: NodeAgentError | None = None
    hashed_bytes: int = 0

    @property
    def is_ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": str(self.path), "ok": self.is_ok, "full": self.is_full}
        doc["seconds"] = round(self.seconds, 3)
        if self.verified is not None:
            by = self.verified
            doc["signedBy"] = {
                "keyId": by.key_id_hex, "keyName": by.key_name, "signatures": list(by.schemes),
            }  # fmt: skip
            doc["trustedComment"] = self.verified.trusted_comment
        if self.manifest is not None:
            doc.update(_manifest_json(self.manifest))
        doc["hashedBytes"] = self.hashed_bytes
        error = self.error
        doc["error"] = None if error is None else _error_json(error)
        return doc


def _manifest_json(manifest: BundleManifest) -> dict[str, Any]:
    return {
        "bundleId": manifest.bundle_id,
        "created": manifest.created,
        "architecture": manifest.architecture,
        "target": None if manifest.target is None else target_doc(manifest.target),
        "channel": manifest.channel,
        "sequence": manifest.sequence,
        "expires": manifest.expires,
        "layout": manifest.layout,
        "images": [
            {"name": str(i.ref), "manifestDigest": i.manifest_digest, "sizeBytes": i.size_bytes}
            for i in manifest.images
        ],
        "pinnedImageSets": [s.name for s in manifest.sets],
        "imageSignatures": signatures_doc(manifest.image_signatures),
        "files": len(manifest.files),
        "totalSizeBytes": manifest.total_size_bytes,
    }


def _error_json(error: NodeAgentError) -> dict[str, Any]:
    return {"reason": error.reason, "message": error.message, "exitCode": error.exit_code}


def verify_bundle(
    root: Path,
    trusted_keys_dir: Path,
    *,
    platform: Platform | None = None,
    is_full: bool = True,
    on_progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    fips_switch: Path = FIPS_ENABLED_FILE,
) -> VerifyReport:
    """Signature, tree, images and (when ``is_full``) every byte of the bundle at ``root``.

    ``platform``: the node's, whose architecture the bundle must have; None: the bundle's
    own architecture (linux), for which its images must be complete. ``fips_switch``: the
    kernel's FIPS switch (``[bundles] fips_switch``).
    """
    started_s = clock()
    state = _Progress(on_progress)
    manifest: BundleManifest | None = None
    verified: ecdsa_signature.ManifestVerified | None = None
    error: NodeAgentError | None = None
    try:
        keys = load_trusted_keys_dir(trusted_keys_dir, fips_switch=fips_switch)
        manifest, verified = read_signed_manifest(root, keys)
        check_signed_bundle(root, manifest, platform or Platform("linux", manifest.architecture))
        if is_full:
            hash_files(root, manifest, state)
    except NodeAgentError as err:
        error = err
    seconds = clock() - started_s
    return VerifyReport(root, is_full, seconds, manifest, verified, error, state.done_bytes)


@dataclass
class _Progress:
    """Counts hashed bytes for the report and passes progress on."""

    forward: Progress | None
    done_bytes: int = 0

    def __call__(self, done_bytes: int, total_bytes: int) -> None:
        self.done_bytes = done_bytes
        if self.forward is not None:
            self.forward(done_bytes, total_bytes)
