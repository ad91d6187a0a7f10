"""Bundle import benchmark: nodeagent's verify and import against sha256sum, skopeo and raw reads.

One signed bundle (default 8 images x one layer of random data, 2.0 GB) on a read-only ext4
loop device (``mkfs.ext4 -d``, ``losetup --read-only``, ``mount -o ro,noload``). Every
measurement starts with a cold page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``);
the two that write images get a fresh vfs store each. Ratios compare numbers of this run.
Run as root::

    .venv/bin/python -m bench.bundle_import [--size-gb 2] [--quick] [--json]

Measurements, in this order every round (MB/s: bundle bytes on the medium / wall time):

* ``raw``: every file of the mounted bundle read once in 16 MiB reads, nothing else: the floor.
* ``sha256sum``: coreutils ``sha256sum`` over the same files (the verification baseline).
* ``openssl`` (info): ``openssl dgst -sha256 -r`` over the same files; coreutils 9.1 has no
  SHA-NI code and OpenSSL (which Python's hashlib uses) does, so this is the faster hash floor.
* ``verify``: ``nodeagent bundle verify MNT --trusted-keys DIR``: signature, tree, every byte.
* ``import``: ``nodeagent bundle import MNT`` against a fresh CRI-O (daemon not started), the
  command and environment ``Agent.cli`` runs, each stderr line stamped as it arrives: process
  start to exit 0. That covers signature + tree check, disk admission, the copy into the
  node's image store (to its ``bundle_stored`` line: "the medium may be removed"; the bytes
  read from the medium's loop device meanwhile, ``/sys/block/loopN/stat``), the loopback server
  (hashing each blob as it sends it), mirror drop-in + reload, CRI pulls (``pull.concurrency``),
  mirror removal + reload, the sets handed over and ONE sync that pins them (drop-in, reload,
  pin check). ``import to bundle_imported`` stops at the ``bundle_imported`` line, before that
  sync.
* ``skopeo``: ``skopeo copy oci:MNT:REF containers-storage:[vfs@ROOT+RUNROOT]REF`` for each
  image in ``index.json``, one after another, into a fresh store with CRI-O's storage.conf.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.prepull import cpu_s, progress, tree_mib
from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from nodeagent.config import PullSettings
from nodeagent.logs import event_of
from tests.testenv.agent import Agent, pinned_image_set_yaml, set_state
from tests.testenv.crio import Crio
from tests.testenv.host_view import own_containers_dir
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.packages import ensure_packages
from tests.testenv.registry import Registry

MB = 1_000_000
GB = 1_000_000_000
MIB = 1 << 20
CHUNK_BYTES = 16 * MIB
SET_NAME = "bench-bundle"
LABEL = "NABENCH"  # not NODEAGENT*: a media watcher on this host must not pick the medium up
MEASUREMENTS = ("raw", "sha256sum", "openssl", "verify", "import", "skopeo")
LABELS = {
    "raw": "raw read, 16 MiB reads (floor)",
    "sha256sum": "sha256sum (baseline)",
    "openssl": "openssl dgst -sha256 (info)",
    "verify": "nodeagent bundle verify",
    "import": "nodeagent bundle import -> exit 0",
    "import_only": "  of it: to bundle_imported",
    "skopeo": "skopeo copy, each image in turn",
}
# Stamped lines of `bundle import` that bound its phases (first occurrence, except the last pull).
PHASES = (
    ("interpreter, imports, CRI connect", "start", "bundle_detected"),
    ("signature + tree check", "bundle_detected", "bundle_verified"),
    ("admission", "bundle_verified", "bundle_admitted"),
    ("stick to store: copy until 'may be removed'", "bundle_admitted", "bundle_stored"),
    ("server start", "bundle_stored", "bundle_importing"),
    ("mirror + reload + pulls", "bundle_importing", "last_image_pulled"),
    ("mirror removal + reload + stop", "last_image_pulled", "bundle_server_stopped"),
    ("sets handed over", "bundle_server_stopped", "bundle_imported"),
    ("sync: pin drop-in, reload, check", "bundle_imported", "exit"),
)
RETRIES = "pull retries (pull_retrying lines)"
_CRIO_PULL = re.compile(r'time="([^"]+)".*msg="(Pulling|Pulled) image: ([^"\s]+)')
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_SHA_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")


class BenchError(RuntimeError):
    """A measured command failed or did not leave what it should have."""


@dataclass
class Measure:
    name: str
    wall_s: float
    cpu_s: dict[str, float]
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Media:
    mountpoint: Path
    devnode: str
    files: list[Path]
    size_bytes: int
    refs: list[str]


# ------------------------------------------------------------------ helpers


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_cpu_s() -> dict[str, float]:
    """CPU seconds all CPUs spent busy (user, nice, system, irq, softirq) and stolen so far.

    Next to a measurement's own CPU seconds, ``machine`` shows how much else ran meanwhile
    (kernel writeback and loop device work, but also any other process); ``steal``, what
    the hypervisor took.
    """
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return {"machine": (user + nice + system + irq + softirq) / _CLK_TCK, "steal": steal / _CLK_TCK}


def machine_spent(before: dict[str, float]) -> dict[str, float]:
    return {key: value - before[key] for key, value in machine_cpu_s().items()}


def run(cmd: list[str], *, what: str, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its stdout, or BenchError with the end of its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BenchError(f"{what} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


TIME = "/usr/bin/time"  # GNU time: %M is the peak resident set size in KiB
MAXRSS = "nodeagent_maxrss_kib="


def nodeagent_cmd(config: Path, *args: str) -> list[str]:
    """What ``Agent.cli`` runs (tests/testenv/agent.py)."""
    return [sys.executable, "-m", "nodeagent", "--config", str(config), *args]


def run_stamped(cmd: list[str], env: dict[str, str]) -> tuple[int, str, list[tuple[float, str]]]:
    """Exit code, stdout and each stderr line with the monotonic time it arrived.

    Python's stderr is line-buffered and structlog flushes each event, so a line's stamp
    is when the CLI logged it (to a pipe read here, within a millisecond).
    """
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
        assert process.stderr is not None
        try:
            lines = [(time.monotonic(), line.rstrip("\n")) for line in process.stderr]
        except BaseException:
            process.kill()  # interrupted: the import must not outlive its runtime and medium
            process.wait()
            raise
        code = process.wait()
        out.seek(0)
        return code, out.read(), lines


def check_hash_output(output: str, media: Media, what: str) -> None:
    """Every file hashed once; every blob's sha256 matches its name."""
    seen = 0
    for line in output.splitlines():
        match = _SHA_LINE.fullmatch(line)
        if match is None:
            raise BenchError(f"{what}: unexpected line {line!r}")
        path = Path(match[2])
        if path.parent.name == "sha256" and path.name != match[1]:
            raise BenchError(f"{what}: {path} hashes to {match[1]}")
        seen += 1
    if seen != len(media.files):
        raise BenchError(f"{what}: {seen} of {len(media.files)} files hashed")


def crio_pulls(log: Path) -> dict[str, float]:
    """From CRI-O's own log: first Pulling to last Pulled, and the mean per image."""
    began: dict[str, datetime] = {}
    spans: list[float] = []
    first: datetime | None = None
    last: datetime | None = None
    for line in log.read_text(errors="replace").splitlines():
        match = _CRIO_PULL.search(line)
        if match is None:
            continue
        when = datetime.fromisoformat(match[1])
        if match[2] == "Pulling":
            began[match[3]] = when
            first = first or when
        elif match[3] in began:
            spans.append((when - began.pop(match[3])).total_seconds())
            last = when
    if first is None or last is None or not spans:
        return {}
    return {
        "crio first Pulling -> last Pulled s": (last - first).total_seconds(),
        "crio mean Pulling -> Pulled per image s": statistics.fmean(spans),
    }


def phases(lines: list[tuple[float, str]], started: float, ended: float) -> dict[str, float]:
    found: dict[str, float] = {"start": started, "exit": ended}
    for stamp, line in lines:
        event = event_of(line) or ""
        found.setdefault(event, stamp)
        if event == "image_pulled":
            found["last_image_pulled"] = stamp
    return {
        f"phase {name} s": found[end] - found[begin]
        for name, begin, end in PHASES
        if begin in found and end in found
    }


async def pinned_refs(endpoint: str, refs: list[str]) -> list[str]:
    async with CriClient(endpoint, timeout_s=60) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [ref for ref, image in zip(refs, found, strict=True) if image and image.is_pinned]


async def runtime_version(endpoint: str) -> str:
    async with CriClient(endpoint, timeout_s=60) as cri:
        v = await cri.version()
    return f"{v.runtime_name} {v.runtime_version}"


# ------------------------------------------------------------------ the bundle and its medium


def make_bundle(base: Path, opts: argparse.Namespace, public: str, secret: str) -> Path:
    """Images pushed to a private registry, ``nodeagent bundle create``, registry removed."""
    layer_bytes = int(opts.size_gb * GB / opts.images)
    images = [
        TestImage(f"bench/app-{i}", [LayerSpec(layer_bytes, opts.seed + i)])
        for i in range(opts.images)
    ]
    key = base / "keys" / "bench.key"
    key.parent.mkdir(parents=True)
    key.write_text(secret)
    (base / "keys" / "bench.pub").write_text(public)
    out = base / "bundle"
    with Registry(base / "registry") as registry:
        progress(f"generating (or reusing) {opts.images} layers of {layer_bytes / MB:.0f} MB")
        built = [image.build() for image in images]
        progress(f"pushing {opts.images} images to {registry.url}")
        refs = [push(registry.url, i.repository, i).reference(registry.host) for i in built]
        spec = base / "set.yaml"
        spec.write_text(pinned_image_set_yaml(SET_NAME, refs))
        progress("nodeagent bundle create")
        cmd = nodeagent_cmd(base / "absent.toml", "bundle", "create", "--image", *refs)
        cmd += ["--pinned-image-set", str(spec), "--key", str(key), "--output", str(out)]
        cmd += ["--insecure-registry", registry.host, "--id", "bench-bundle"]
        run(cmd, what="nodeagent bundle create")
    shutil.rmtree(base / "registry", ignore_errors=True)
    return out


def bundle_refs(root: Path) -> list[str]:
    """The full references ``index.json`` names (``org.opencontainers.image.ref.name``)."""
    index = json.loads((root / "index.json").read_text())
    return [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]


@contextmanager
def ext4_media(bundle_dir: Path, work: Path) -> Iterator[Media]:
    """The bundle on an ext4 image, attached read-only and mounted ro,noload; all undone."""
    image = work / "media.img"
    size_bytes = sum(f.stat().st_size for f in bundle_dir.rglob("*") if f.is_file())
    with image.open("wb") as sparse:
        sparse.truncate(max(64 * MIB, size_bytes * 2))
    progress(f"mkfs.ext4 -d ({size_bytes / GB:.2f} GB)")
    run(["mkfs.ext4", "-q", "-F", "-L", LABEL, "-d", str(bundle_dir), str(image)], what="mkfs")
    shutil.rmtree(bundle_dir)
    mountpoint = work / "mnt"
    mountpoint.mkdir()
    devnode = ""
    is_mounted = False
    try:
        cmd = ["losetup", "--find", "--show", "--read-only", str(image)]
        devnode = run(cmd, what="losetup").strip()
        run(["mount", "-o", "ro,noload", devnode, str(mountpoint)], what="mount")
        is_mounted = True
        files = sorted(p for p in mountpoint.rglob("*") if p.is_file())
        total = sum(f.stat().st_size for f in files)
        yield Media(mountpoint, devnode, files, total, bundle_refs(mountpoint))
    finally:
        if is_mounted and subprocess.run(["umount", str(mountpoint)], check=False).returncode:
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
        if devnode:
            subprocess.run(["losetup", "--detach", devnode], check=False)
        image.unlink(missing_ok=True)


# ------------------------------------------------------------------ measurements


def sectors_read(devnode: str) -> int:
    """512-byte sectors read from the device so far (``/sys/block/<dev>/stat``, field 3)."""
    return int(Path(f"/sys/block/{Path(devnode).name}/stat").read_text().split()[2])


def measure_raw(media: Media) -> Measure:
    buffer = memoryview(bytearray(CHUNK_BYTES))
    drop_caches()
    busy_before, cpu_before, started = machine_cpu_s(), self_cpu_s(), time.monotonic()
    total = 0
    for path in media.files:
        with path.open("rb", buffering=0) as stream:
            while count := stream.readinto(buffer):
                total += count
    wall_s = time.monotonic() - started
    if total != media.size_bytes:
        raise BenchError(f"raw read {total} bytes of {media.size_bytes}")
    cpu = {"bench": self_cpu_s() - cpu_before} | machine_spent(busy_before)
    return Measure("raw", wall_s, cpu)


def measure_hash_tool(name: str, cmd: list[str], media: Media) -> Measure:
    files = [str(f) for f in media.files]
    drop_caches()
    busy_before, cpu_before, started = machine_cpu_s(), children_cpu_s(), time.monotonic()
    output = run([*cmd, *files], what=name)
    wall_s = time.monotonic() - started
    cpu = {name: children_cpu_s() - cpu_before} | machine_spent(busy_before)
    check_hash_output(output, media, name)
    return Measure(name, wall_s, cpu)


def measure_verify(base: Path, media: Media) -> Measure:
    cmd = nodeagent_cmd(base / "absent.toml", "bundle", "verify", str(media.mountpoint))
    cmd += ["--trusted-keys", str(base / "keys"), "--json"]
    drop_caches()
    busy_before, cpu_before, started = machine_cpu_s(), children_cpu_s(), time.monotonic()
    output = run(cmd, what="nodeagent bundle verify")
    wall_s = time.monotonic() - started
    cpu = {"nodeagent": children_cpu_s() - cpu_before} | machine_spent(busy_before)
    report = json.loads(output)
    if not report["ok"] or report["hashedBytes"] < media.size_bytes * 0.99:
        raise BenchError(f"verify: not ok or not full: {report}")
    extra = {"verify's own seconds (no interpreter start)": float(report["seconds"])}
    return Measure("verify", wall_s, cpu, extra)


def keep_logs(logs_dir: Path | None, round_no: int, crio_log: Path, lines: list[Any]) -> None:
    """CRI-O's log and the stamped ``bundle import`` lines (seconds from its start) to keep."""
    if logs_dir is None:
        return
    logs_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(crio_log, logs_dir / f"crio-{round_no}.log")
    text = "".join(f"{stamp:9.3f} {line}\n" for stamp, line in lines)
    (logs_dir / f"import-{round_no}.log").write_text(text)


def measure_import(
    base: Path, media: Media, public: str, round_no: int, logs_dir: Path | None
) -> Measure:
    with Crio(base / f"crio-{round_no}") as crio:
        assert crio.process is not None
        agent = Agent(base / f"agent-{round_no}", crio)
        agent.write_config()
        agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
        (agent.trusted_keys_dir / "bench.pub").write_text(public)
        cmd = nodeagent_cmd(agent.config_file, "bundle", "import", str(media.mountpoint), "--json")
        cmd = [TIME, "-f", f"{MAXRSS}%M", *cmd]  # the import's peak RSS, for the unit's MemoryMax=
        drop_caches()
        crio_before, cpu_before = cpu_s(crio.process.pid), children_cpu_s()
        sectors_before = sectors_read(media.devnode)
        busy_before, started = machine_cpu_s(), time.monotonic()
        code, stdout, lines = run_stamped(cmd, agent.env())
        ended = time.monotonic()
        device_bytes = (sectors_read(media.devnode) - sectors_before) * 512
        keep_logs(logs_dir, round_no, crio.log_path, [(t - started, x) for t, x in lines])
        cpu = {"nodeagent": children_cpu_s() - cpu_before}
        cpu["crio"] = cpu_s(crio.process.pid) - crio_before
        cpu |= machine_spent(busy_before)
        if code != 0:
            tail = "\n".join(line for _, line in lines[-30:])
            raise BenchError(f"bundle import exited {code}:\n{tail}")
        report = json.loads(stdout[stdout.index("{") :])
        status = agent.status() or {}
        if set_state(status, SET_NAME) != "Pinned":
            raise BenchError(f"set {SET_NAME} not Pinned after import: {status}")
        pinned = asyncio.run(pinned_refs(crio.endpoint, media.refs))
        if pinned != media.refs:
            raise BenchError(f"{len(pinned)} of {len(media.refs)} images pinned after import")
        extra = phases(lines, started, ended) | crio_pulls(crio.log_path)
        extra[RETRIES] = float(sum(1 for _, line in lines if "pull_retrying:" in line))
        extra["peak RSS MiB"] = max(
            (int(line[len(MAXRSS) :]) / 1024 for _, line in lines if line.startswith(MAXRSS)),
            default=0.0,
        )
        extra["bytes served MB"] = report["bytes"]["served"] / MB
        extra["medium device bytes read / bundle bytes"] = device_bytes / media.size_bytes
        stored = next((t for t, line in lines if event_of(line) == "bundle_stored"), None)
        if stored is not None:
            extra["start -> medium may be removed s"] = stored - started
        extra["store MiB"] = tree_mib(crio.storage_root)
        imported = next((t for t, line in lines if event_of(line) == "bundle_imported"), None)
        if imported is not None:
            extra["import_only_s"] = imported - started
    shutil.rmtree(agent.base, ignore_errors=True)
    return Measure("import", ended - started, cpu, extra)


def skopeo_policy(directory: Path) -> Path:
    """A policy.json accepting every image (the test registry's and the bundle's)."""
    policy = directory / "skopeo-policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    return policy


def skopeo_copies(
    pairs: list[tuple[str, str]],
    policy: Path,
    env: dict[str, str] | None = None,
    *,
    parallel: int = 1,
    options: tuple[str, ...] = (),
) -> None:
    """``skopeo copy SOURCE DEST`` for each pair, ``parallel`` processes at once."""

    def one(pair: tuple[str, str]) -> None:
        cmd = ["skopeo", "--policy", str(policy), "copy", "--quiet", *options, *pair]
        run(cmd, what=f"skopeo copy {pair[0]}", env=env)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, pairs))


def measure_skopeo(base: Path, media: Media, round_no: int) -> Measure:
    work = base / f"skopeo-{round_no}"
    root, runroot = work / "lib" / "containers", work / "run" / "storage"
    work.mkdir(parents=True)
    storage_conf = work / "storage.conf"
    # What tests/testenv/crio.py gives CRI-O: the vfs driver, no other option.
    storage_conf.write_text(
        f'[storage]\ndriver = "vfs"\nrunroot = "{runroot}"\ngraphroot = "{root}"\n'
    )
    policy = skopeo_policy(work)
    env = dict(os.environ, CONTAINERS_STORAGE_CONF=str(storage_conf))
    store = f"containers-storage:[vfs@{root}+{runroot}]"
    try:
        drop_caches()
        busy_before, cpu_before = machine_cpu_s(), children_cpu_s()
        started = time.monotonic()
        pairs = [(f"oci:{media.mountpoint}:{ref}", store + ref) for ref in media.refs]
        skopeo_copies(pairs, policy, env)
        wall_s = time.monotonic() - started
        cpu = {"skopeo": children_cpu_s() - cpu_before} | machine_spent(busy_before)
        stored = json.loads((root / "vfs-images" / "images.json").read_text())
        if len(stored) != len(media.refs):
            raise BenchError(f"skopeo stored {len(stored)} of {len(media.refs)} images")
        return Measure("skopeo", wall_s, cpu, {"store MiB": tree_mib(root)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Setup:
    """What every measurement of a run shares."""

    base: Path
    media: Media
    public_key: str
    logs_dir: Path | None


def measure(name: str, setup: Setup, round_no: int) -> Measure:
    base, media = setup.base, setup.media
    if name == "raw":
        return measure_raw(media)
    if name == "sha256sum":
        return measure_hash_tool(name, ["sha256sum", "--"], media)
    if name == "openssl":
        return measure_hash_tool(name, ["openssl", "dgst", "-sha256", "-r"], media)
    if name == "verify":
        return measure_verify(base, media)
    if name == "import":
        return measure_import(base, media, setup.public_key, round_no, setup.logs_dir)
    return measure_skopeo(base, media, round_no)


# ------------------------------------------------------------------ report


def summarize(runs: dict[str, list[Measure]], size_bytes: int) -> dict[str, Any]:
    wall = {name: statistics.median(m.wall_s for m in ms) for name, ms in runs.items()}
    wall["import_only"] = statistics.median(
        m.extra.get("import_only_s", float("nan")) for m in runs["import"]
    )
    rate = {name: size_bytes / MB / seconds for name, seconds in wall.items()}
    checks = [
        ("import/skopeo", wall["import"] / wall["skopeo"], 1.25),
        ("verify/sha256sum", wall["verify"] / wall["sha256sum"], 1.1),
        ("import/raw read", wall["import"] / wall["raw"], None),
        ("import to bundle_imported/skopeo (info)", wall["import_only"] / wall["skopeo"], None),
        ("verify/openssl sha256 (info)", wall["verify"] / wall["openssl"], None),
    ]
    return {
        "wall_s": wall,
        "mb_per_s": rate,
        "checks": [
            {
                "name": name,
                "value": value,
                "target_max": target,
                "result": None if target is None else ("PASS" if value <= target else "MISS"),
            }
            for name, value, target in checks
        ],
    }


def median_extra(measures: list[Measure]) -> dict[str, float]:
    """Each extra figure's median (retries: their sum), in the order the first holds them."""
    keys = list(dict.fromkeys(k for m in measures for k in m.extra if k != "import_only_s"))
    found = {k: [m.extra.get(k, float("nan")) for m in measures] for k in keys}
    return {
        f"{k}, all rounds" if k == RETRIES else k: sum(v) if k == RETRIES else statistics.median(v)
        for k, v in found.items()
    }


def render_table(report: dict[str, Any]) -> str:
    m, w, summary = report["machine"], report["workload"], report["summary"]
    runs: dict[str, list[Measure]] = report["runs"]
    lines = [
        f"workload: {w['images']} images x 1 layer of {w['layer_mb']:.0f} MB random data "
        f"(gzip -1), bundle {w['bundle_bytes'] / GB:.3f} GB in {w['files']} files, "
        f"read-only ext4 on {w['devnode']}, median of {w['repeat']}",
        f"machine: {m['nproc']} CPUs, {m['mem_gib']:.1f} GiB, Linux {m['kernel']}, "
        f"{m['runtime']}, {m['skopeo']}, Python {m['python']}",
        "cold page cache before each measurement; fresh vfs store for import and skopeo;",
        "CPU s 'machine': all CPUs busy meanwhile (kernel work too); far above the measured",
        "processes' own CPU, or a large 'steal', means something else ran: measure again.",
        "",
        f"{'measurement':36} {'wall s':>8} {'MB/s':>7}  CPU s",
    ]
    for name in (*MEASUREMENTS[:5], "import_only", "skopeo"):
        source = runs["import" if name == "import_only" else name]
        cpu = ""
        if name != "import_only":
            keys = source[0].cpu_s
            cpu = ", ".join(
                f"{k} {statistics.median(x.cpu_s[k] for x in source):.1f}" for k in keys
            )
        lines.append(
            f"{LABELS[name]:36} {summary['wall_s'][name]:8.2f} "
            f"{summary['mb_per_s'][name]:7.0f}  {cpu}"
        )
    for name in ("verify", "import", "skopeo"):
        lines += ["", f"{name} (median):"]
        lines += [f"  {k:44} {v:9.2f}" for k, v in median_extra(runs[name]).items()]
    lines += [
        "",
        f"notes: {m['nproc']} CPUs; CRI-O and skopeo both check every blob's digest, gunzip",
        "and write a vfs store (one full copy per layer). import also runs Python, a loopback",
        "HTTP server hashing what it sends, two CRI-O reloads for the mirror and one sync.",
        "skopeo copies one image at a time; the import pulls pull.concurrency "
        f"({PullSettings().concurrency}, the default) at once.",
        "A pull retry costs >= 5 s (RegistryUnavailable): a pull that starts before CRI-O",
        "applied the mirror reload goes to the image's own (absent) registry.",
        "",
        f"{'check':40} {'value':>7} {'target':>8}  result",
    ]
    for c in summary["checks"]:
        target = "-" if c["target_max"] is None else f"<= {c['target_max']:g}"
        lines.append(f"{c['name']:40} {c['value']:7.2f} {target:>8}  {c['result'] or '-'}")
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.bundle_import", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size-gb", type=float, default=2.0, help="bundle size, GB (default 2.0)")
    p.add_argument("--quick", action="store_true", help="a 0.3 GB bundle instead of --size-gb")
    p.add_argument("--images", type=int, default=8, help="images, one layer each (default 8)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every measurement; median")
    p.add_argument("--seed", type=int, default=4242, help="layer content seed (4242)")
    p.add_argument("--workdir", type=Path, help="parent of the temp dir (default: $TMPDIR)")
    p.add_argument("--logs", type=Path, help="keep CRI-O's log and the import's lines here")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gb = 0.3
    return opts


def tool_version(cmd: list[str]) -> str:
    return run(cmd, what=cmd[0]).splitlines()[0].strip()


def machine(runtime: str) -> dict[str, Any]:
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "mem_gib": mem_kib / 1024 / 1024,
        "kernel": platform.release(),
        "runtime": runtime,
        "skopeo": tool_version(["skopeo", "--version"]),
        "sha256sum": tool_version(["sha256sum", "--version"]),
        "openssl": tool_version(["openssl", "version"]),
        "python": platform.python_version(),
    }


def bench(base: Path, opts: argparse.Namespace) -> dict[str, Any]:
    public, secret = minisign.generate_keypair(comment="nodeagent bench")
    started = time.monotonic()
    bundle_dir = make_bundle(base, opts, public, secret)
    create_s = time.monotonic() - started
    runs: dict[str, list[Measure]] = {name: [] for name in MEASUREMENTS}
    with ext4_media(bundle_dir, base) as media:
        setup = Setup(base, media, public, opts.logs)
        for round_no in range(1, opts.repeat + 1):
            for name in MEASUREMENTS:
                progress(f"round {round_no}/{opts.repeat}: {name}")
                result = measure(name, setup, round_no)
                progress(f"  {result.wall_s:.2f} s")
                runs[name].append(result)
        workload = {
            "images": opts.images,
            "layer_mb": opts.size_gb * GB / opts.images / MB,
            "bundle_bytes": media.size_bytes,
            "files": len(media.files),
            "devnode": media.devnode,
            "repeat": opts.repeat,
            "seed": opts.seed,
            "setup_create_s": create_s,
        }
    with Crio(base / "crio-version") as crio:
        runtime = asyncio.run(runtime_version(crio.endpoint))
    return {
        "machine": machine(runtime),
        "workload": workload,
        "runs": runs,
        "summary": summarize(runs, workload["bundle_bytes"]),
    }


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_as_root(
    module: str,
    prefix: str,
    opts: argparse.Namespace,
    bench: Callable[[Path, argparse.Namespace], dict[str, Any]],
    render_table: Callable[[dict[str, Any]], str],
) -> int:
    """Run ``bench`` in a scratch directory as root and print its report (table or JSON).

    Shared by the benchmarks that mount a loop device and start CRI-O.
    """
    if os.geteuid() != 0:
        print(f"{module} mounts a loop device and starts CRI-O: run it as root", file=sys.stderr)
        return 2
    ensure_packages()
    # SIGTERM (and SIGINT, even when a non-interactive shell ignores it for background jobs)
    # end the run through the finally blocks: unmount, detach, stop CRI-O, remove temp dirs.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=opts.workdir))
    try:
        with own_containers_dir():
            report = bench(base, opts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if opts.json:
        runs = report.get("runs")
        out = report if runs is None else dict(report, runs={
            n: [asdict(m) for m in ms] for n, ms in runs.items()})  # fmt: skip
        print(json.dumps(out, indent=2))
    else:
        print(render_table(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_as_root("bench.bundle_import", "nodeagent-bench-bundle-", opts, bench, render_table)


if __name__ == "__main__":
    sys.exit(main())
