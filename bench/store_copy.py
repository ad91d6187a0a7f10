"""Stick-to-store benchmark: ``copy_bundle`` against a raw read of the medium and a raw write.

One signed bundle (default 4 images x one layer of random data, 1.0 GB) on a read-only ext4
loop device (``mkfs.ext4 -d``, ``losetup --read-only``, ``mount -o ro,noload``), copied into a
store on another filesystem: a second ext4 image on its own loop device, mounted read-write.
Both image files sit on the same disk as everything else on this machine (said in the
output). Every measurement starts with a cold page cache (``sync; echo 3 >
/proc/sys/vm/drop_caches``) and an empty store. Run as root::

    .venv/bin/python -m bench.store_copy [--size-gb 1] [--throttle-mbps 40] [--json]

Measurements (MB/s: blob bytes / wall time):

* ``read``: every blob file of the medium read once in 16 MiB reads: (a);
* ``write``: the same sizes written to files on the store filesystem from memory, each
  fsynced and renamed, as a careful copy must: (b);
* ``copy``: ``adapters.store.copier.copy_bundle`` (signature, admission, each blob read
  once, hashed, written, fsynced, renamed; records and index): (c);
  bytes read from the medium's device during it, from ``/sys/block/loopN/stat``;
* ``sha256 (memory)``: hashing as many bytes from memory, the CPU floor of any verified copy;
* with ``--throttle-mbps``: ``read`` and ``copy`` again with this process in a cgroup v1
  ``blkio`` group whose ``blkio.throttle.read_bps_device`` limits the medium's loop device
  (a USB-stick-like rate).

Goals (issue 14): c / max(a, b) <= 1.1; device bytes / bundle bytes <= 1.01; throttled copy
rate >= 0.9 x the throttle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent import logs
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles import minisign
from nodeagent.bundles.manifest import parse_manifest
from tests.testenv.images import LayerSpec, TestImage
from tests.testenv.oci_layout import write_oci_layout

MB = 1_000_000
GB = 1_000_000_000
MIB = 1 << 20
CHUNK_BYTES = 16 * MIB
LABEL = "NABENCHSTORE"  # not NODEAGENT*: a media watcher on this host must leave it alone
BLKIO = Path("/sys/fs/cgroup/blkio")


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Loop:
    devnode: str
    mountpoint: Path

    @property
    def sectors_read(self) -> int:
        stat = Path(f"/sys/block/{Path(self.devnode).name}/stat").read_text().split()
        return int(stat[2])

    @property
    def dev(self) -> str:
        info = Path(self.devnode).stat()
        return f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


@dataclass
class Measure:
    name: str
    seconds: float
    size_bytes: int
    device_bytes: int | None = None

    @property
    def mb_per_s(self) -> float:
        return self.size_bytes / MB / self.seconds


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def make_bundle(root: Path, keys: Path, opts: argparse.Namespace) -> None:
    """A signed OCI-layout bundle of ``opts.images`` images, one random layer each."""
    layer_bytes = int(opts.size_gb * GB / opts.images)
    progress(f"generating (or reusing) {opts.images} layers of {layer_bytes / MB:.0f} MB")
    images = [
        TestImage(f"bench/store-{i}", [LayerSpec(layer_bytes, opts.seed + i)]).build()
        for i in range(opts.images)
    ]
    write_oci_layout(root, "bench.example", images, bundle_id="bench-store")
    public, secret = minisign.generate_keypair(comment="bench store")
    keys.mkdir(parents=True)
    (keys / "bench.pub").write_text(public)
    data = (root / "bundle.json").read_bytes()
    signature = minisign.sign(data, minisign.parse_secret_key(secret), trusted_comment="bench")
    (root / "bundle.json.minisig").write_text(signature)


@contextmanager
def loop_fs(
    image: Path, mountpoint: Path, *, size_bytes: int, content: Path | None
) -> Iterator[Loop]:
    """An ext4 image (holding ``content`` read-only, or empty read-write) attached and mounted."""
    with image.open("wb") as sparse:
        sparse.truncate(size_bytes)
    cmd = ["mkfs.ext4", "-q", "-F", "-L", LABEL]
    run([*cmd, "-d", str(content), str(image)] if content else [*cmd, str(image)])
    mountpoint.mkdir()
    readonly = ["--read-only"] if content else []
    devnode = run(["losetup", "--find", "--show", *readonly, str(image)]).strip()
    try:
        run(["mount", "-o", "ro,noload" if content else "rw", devnode, str(mountpoint)])
        try:
            yield Loop(devnode, mountpoint)
        finally:
            subprocess.run(["umount", str(mountpoint)], check=False)
    finally:
        subprocess.run(["losetup", "--detach", devnode], check=False)
        image.unlink(missing_ok=True)


def blob_files(medium: Path) -> list[Path]:
    return sorted(p for p in (medium / "blobs" / "sha256").iterdir())


def measure_read(medium: Loop) -> Measure:
    buffer = memoryview(bytearray(CHUNK_BYTES))
    files = blob_files(medium.mountpoint)
    drop_caches()
    before, started = medium.sectors_read, time.monotonic()
    total = 0
    for path in files:
        with path.open("rb", buffering=0) as stream:
            while count := stream.readinto(buffer):
                total += count
    seconds = time.monotonic() - started
    return Measure("read", seconds, total, (medium.sectors_read - before) * 512)


def measure_write(medium: Loop, store_fs: Path) -> Measure:
    sizes = [p.stat().st_size for p in blob_files(medium.mountpoint)]
    data = memoryview(os.urandom(CHUNK_BYTES))
    target = store_fs / "raw"
    target.mkdir()
    drop_caches()
    started = time.monotonic()
    for index, size in enumerate(sizes):
        tmp, final = target / f"{index}.tmp", target / str(index)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = size
            while left:
                left -= os.write(fd, data[: min(left, CHUNK_BYTES)])
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.rename(final)
    dir_fd = os.open(target, os.O_RDONLY)
    os.fsync(dir_fd)
    os.close(dir_fd)
    seconds = time.monotonic() - started
    shutil.rmtree(target)
    return Measure("write", seconds, sum(sizes))


def measure_hash(size_bytes: int) -> Measure:
    """SHA-256 of as many bytes, from memory: the CPU floor of any verified copy."""
    data = memoryview(os.urandom(CHUNK_BYTES))
    hasher = hashlib.sha256()
    started = time.monotonic()
    for offset in range(0, size_bytes, CHUNK_BYTES):
        hasher.update(data[: min(CHUNK_BYTES, size_bytes - offset)])
    return Measure("sha256 (memory)", time.monotonic() - started, size_bytes)


def measure_copy(medium: Loop, store: Path, keys: Path, name: str = "copy") -> Measure:
    if store.exists():
        shutil.rmtree(store)
    manifest = parse_manifest((medium.mountpoint / "bundle.json").read_bytes())
    drop_caches()
    before, started = medium.sectors_read, time.monotonic()
    result = copy_bundle(store, medium.mountpoint, manifest, keys)
    seconds = time.monotonic() - started
    return Measure(name, seconds, result.bytes_copied, (medium.sectors_read - before) * 512)


@contextmanager
def throttled(device: str, bytes_per_s: int) -> Iterator[None]:
    """This process in a blkio cgroup that limits reads from ``device`` (cgroup v1)."""
    group = BLKIO / f"nodeagent-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "blkio.throttle.read_bps_device").write_text(f"{device} {bytes_per_s}\n")
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            yield
        finally:
            (BLKIO / "cgroup.procs").write_text(f"{os.getpid()}\n")
    finally:
        group.rmdir()


def measure_all(opts: argparse.Namespace, work: Path) -> dict[str, object]:
    bundle, keys = work / "bundle", work / "keys"
    make_bundle(bundle, keys, opts)
    bundle_bytes = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    size = max(64 * MIB, bundle_bytes * 2)
    with loop_fs(work / "medium.img", work / "medium", size_bytes=size, content=bundle) as medium:
        shutil.rmtree(bundle)
        store_size = 3 * size
        with loop_fs(
            work / "store.img", work / "store-fs", size_bytes=store_size, content=None
        ) as fs:
            measures = []
            for _ in range(opts.rounds):
                shutil.rmtree(fs.mountpoint / "store", ignore_errors=True)
                measures += [measure_read(medium), measure_write(medium, fs.mountpoint)]
                measures.append(measure_copy(medium, fs.mountpoint / "store", keys))
                measures.append(measure_hash(measures[-1].size_bytes))
            if opts.throttle_mbps:
                progress(f"throttling reads from {medium.devnode} to {opts.throttle_mbps} MB/s")
                with throttled(medium.dev, int(opts.throttle_mbps * MB)):
                    read = measure_read(medium)
                    read.name = "read throttled"
                    measures += [
                        read,
                        measure_copy(medium, fs.mountpoint / "store", keys, "copy throttled"),
                    ]
    return summarize(measures, bundle_bytes, opts)


def _best(measures: list[Measure], name: str) -> Measure | None:
    found = sorted((m for m in measures if m.name == name), key=lambda m: m.seconds)
    return found[len(found) // 2] if found else None  # the median


def summarize(
    measures: list[Measure], bundle_bytes: int, opts: argparse.Namespace
) -> dict[str, object]:
    read, write, copy = (_best(measures, n) for n in ("read", "write", "copy"))
    assert read and write and copy
    doc: dict[str, object] = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        "shared_disk": "yes: both loop images are files on the same disk",
        "bundle_bytes": bundle_bytes,
        "measures": [asdict(m) | {"mb_per_s": round(m.mb_per_s, 1)} for m in measures],
        "copy_over_slower_raw": round(copy.seconds / max(read.seconds, write.seconds), 3),
        "device_bytes_over_bundle": round((copy.device_bytes or 0) / bundle_bytes, 4),
    }
    throttled_copy = _best(measures, "copy throttled")
    if throttled_copy is not None:
        doc["throttled_copy_over_throttle"] = round(throttled_copy.mb_per_s / opts.throttle_mbps, 3)
    return doc


def print_report(doc: dict[str, object]) -> None:
    print(f"machine: {doc['machine']}; medium and store share a disk: {doc['shared_disk']}")
    print(f"bundle: {int(str(doc['bundle_bytes'])) / GB:.2f} GB")
    for m in doc["measures"]:  # type: ignore[attr-defined]
        device = f", device read {m['device_bytes'] / GB:.3f} GB" if m["device_bytes"] else ""
        print(f"  {m['name']:<16} {m['seconds']:7.2f} s {m['mb_per_s']:8.1f} MB/s{device}")
    print(f"copy / max(read, write) = {doc['copy_over_slower_raw']} (goal <= 1.1)")
    print(f"device bytes / bundle bytes = {doc['device_bytes_over_bundle']} (goal <= 1.01)")
    if "throttled_copy_over_throttle" in doc:
        print(f"throttled copy / throttle = {doc['throttled_copy_over_throttle']} (goal >= 0.9)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1400)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--throttle-mbps", type=float, default=0.0)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    logs.configure("warning")  # stderr; stdout is the report
    if os.geteuid() != 0:
        print("bench.store_copy mounts loop devices and drops caches: run it as root")
        return 2
    with tempfile.TemporaryDirectory(prefix="nodeagent-store-bench-", dir="/var/tmp") as tmp:
        doc = measure_all(opts, Path(tmp))
    if opts.json:
        print(json.dumps(doc, indent=2))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
