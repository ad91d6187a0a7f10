"""The steps of ``bench.release_scale``, each measured next to its baseline in the same run.

Every step writes only on the scratch filesystem (``bench/scale_measure.py``), starts from
a cold page cache, and is polled for peak RSS (``VmHWM``, per process role) and the disk
used at its peak. A step returns a ``Step``: the nodeagent side and the baseline side.

Run as a child (the stick-to-store copy, so that its peak RSS is its own)::

    python -m bench.scale_steps copy STORE MEDIUM TRUSTED_KEYS
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.bundle_import import (
    Media,
    crio_pulls,
    drop_caches,
    measure_raw,
    nodeagent_cmd,
    pinned_refs,
    run,
    run_stamped,
    sectors_read,
    skopeo_copies,
    skopeo_policy,
)
from bench.prepull import progress
from bench.restore import Node, close_node, make_node, measure_restore, wipe_runtime
from bench.scale_measure import Peaks
from bench.store_copy import Loop, measure_hash, measure_write
from nodeagent.adapters.store import keeper
from nodeagent.config import PullSettings
from nodeagent.config.settings import StoreSettings
from nodeagent.daemon.policies import BUNDLE_PULLS_AT_ONCE
from nodeagent.logs import event_of
from nodeagent.store.keeping import KeepRules
from tests.testenv.blkio import throttled_reads

T = TypeVar("T")
Stamped = list[tuple[float, str]]
SHA_CMD = ["openssl", "dgst", "-sha256", "-r"]
NODEAGENT_ROLES = ("nodeagent", "bench.scale_steps")
"""Process roles that are nodeagent's code (the copy child runs ``copy_bundle``)."""


class StepError(RuntimeError):
    """A step failed or did not leave what it should have."""


@dataclass
class Side:
    """One side of a step: nodeagent's or the baseline's."""

    what: str
    seconds: float
    rss_mib: dict[str, float]
    """Peak RSS (VmHWM) per process role."""
    disk_bytes: int
    anon_mib: dict[str, float] = field(default_factory=dict)
    """The largest anonymous RSS (RssAnon) polled per role: what of the peak is heap."""

    def nodeagent_rss_mib(self) -> float:
        found = [v for k, v in self.rss_mib.items() if k.startswith(NODEAGENT_ROLES)]
        return max(found, default=0.0)


@dataclass
class Step:
    name: str
    nodeagent: Side
    baseline: Side | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What every step of one size shares."""

    scratch: Path
    empty_used: int
    """Bytes used on the scratch filesystem when it held nothing."""
    public_key: str
    release_ref: str
    registry_host: str
    signature_dir: Path
    secret_key: Path
    label: str
    """The size, for file names."""
    logs: Path | None
    """Where the import's stamped lines and CRI-O's log are kept (None: nowhere)."""

    def peaks(self, *, from_empty: bool = False) -> Peaks:
        return Peaks(lambda: [os.getpid()], self.scratch,
                     base_used=self.empty_used if from_empty else None)  # fmt: skip


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def timed(
    ctx: Context, what: str, action: Callable[[], T], *, from_empty: bool = False
) -> tuple[Side, T]:
    """``action`` run with a cold cache, polled: its Side and its result."""
    drop_caches()
    progress(f"  {what}")
    peaks = ctx.peaks(from_empty=from_empty)
    with peaks.watching():
        started = time.monotonic()
        result = action()
        seconds = time.monotonic() - started
    progress(f"  {seconds:.2f} s")
    return Side(what, seconds, peaks.rss_mib(), peaks.disk_bytes, peaks.anon_mib()), result


# ------------------------------------------------------------------ bundle create


def step_create(ctx: Context, bundle: Path, *, with_baseline: bool = True) -> Step:
    """``bundle create --release`` vs ``skopeo copy`` of the same images into an OCI layout."""
    cmd = nodeagent_cmd(ctx.scratch / "absent.toml", "bundle", "create", "--release",
                        ctx.release_ref, "--signature-dir", str(ctx.signature_dir), "--key",
                        str(ctx.secret_key), "--output", str(bundle), "--arch", "amd64",
                        "--insecure-registry", ctx.registry_host)  # fmt: skip
    side, _ = timed(ctx, "nodeagent bundle create --release", lambda: run(cmd, what="create"))
    doc = json.loads((bundle / "bundle.json").read_text())
    extra = {"images": len(doc["images"]), "blobs": len(doc["blobs"]),
             "bundle_bytes": tree_bytes(bundle)}  # fmt: skip
    if not with_baseline:
        return Step("create", side, None, extra)
    layout = ctx.scratch / "skopeo-oci"
    policy = skopeo_policy(ctx.scratch)
    # One image at a time: bundle create fetches one blob at a time (adapters/bundles/fetcher.py).
    pairs = [
        (f"docker://{i['name']}", f"oci:{layout}:image-{n}") for n, i in enumerate(doc["images"])
    ]
    options = ("--src-tls-verify=false", "--override-arch", "amd64")
    base, _ = timed(ctx, "skopeo copy docker:// -> oci:, image after image",
                    lambda: skopeo_copies(pairs, policy, options=options))  # fmt: skip
    extra["skopeo_layout_bytes"] = tree_bytes(layout)
    shutil.rmtree(layout)
    return Step("create", side, base, extra)


# ------------------------------------------------------------------ refused import


def crio_images(node: Node) -> int:
    """Images in the node's CRI-O storage (its vfs ``images.json``)."""
    index = node.crio.storage_root / "vfs-images" / "images.json"
    return len(json.loads(index.read_text())) if index.exists() else 0


def tampered_copy(bundle: Path, target: Path) -> str:
    """``bundle`` hard-linked into ``target`` with one layer (the middle one in the
    manifest's order) changed by one byte: the signature still holds; the blob does not."""
    doc = json.loads((bundle / "bundle.json").read_text())
    sizes = sorted(doc["blobs"], key=lambda b: b["sizeBytes"])
    victim = sizes[len(sizes) * 3 // 4]["digest"]
    for path in bundle.rglob("*"):
        dest = target / path.relative_to(bundle)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dest)
    blob = target / "blobs" / "sha256" / victim.removeprefix("sha256:")
    data = bytearray(blob.read_bytes())
    blob.unlink()
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    return str(victim)


def store_after_grace(store: Path) -> int:
    """The store's bytes once the keeper has run at the end of ``gc_grace_s`` (the daemon
    runs it every half grace period): what a refused import leaves for good."""
    if not store.exists():
        return 0
    rules = KeepRules(StoreSettings().gc_grace_s, StoreSettings().keep_newest_per_channel)
    now = time.time()
    keeper.collect(store, [], rules, now)  # marks the unreferenced blobs
    keeper.collect(store, [], rules, now + rules.gc_grace_s + 1)
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file() and "blobs" in p.parts)


STORE_CONTENT = ("blobs", "tmp", "bundles")
"""What the store holds for bundles (blobs, partial blobs, signed manifests and records);
its other files (``oci-layout``, an empty ``index.json``, the lock) are its layout, there
whatever it holds (``nodeagent/store/layout.py``)."""


def step_refused(ctx: Context, bundle: Path) -> Step:
    """A tampered copy of the bundle imported: refused, and nothing left behind."""
    tampered = ctx.scratch / "tampered"
    victim = tampered_copy(bundle, tampered)
    node = make_node(ctx.scratch / "refused-node", ctx.public_key)
    try:
        before = os.statvfs(ctx.scratch)
        cmd = nodeagent_cmd(node.agent.config_file, "bundle", "import", str(tampered), "--json")
        side, outcome = timed(ctx, "nodeagent bundle import (tampered)",
                              lambda: run_stamped(cmd, node.agent.env()))  # fmt: skip
        code, _out, lines = outcome
        after = os.statvfs(ctx.scratch)
        said = [line for _, line in lines if line.startswith("error:")]

        left = {
            "exit_code": code,
            "error": said[-1][:300] if said else "",
            "store_bytes_left": sum(tree_bytes(node.store / part) for part in STORE_CONTENT),
            "store_files_left": sorted(
                str(p.relative_to(node.store)) for p in node.store.rglob("*") if p.is_file()
            )
            if node.store.exists()
            else [],
            "crio_storage_bytes_left": tree_bytes(node.crio.storage_root / "vfs"),
            "crio_images_left": crio_images(node),
            "scratch_bytes_left": (before.f_bfree - after.f_bfree) * before.f_frsize,
            "store_bytes_after_gc_grace": store_after_grace(node.store),
            "tampered_blob": victim,
        }
    finally:
        close_node(node)
        shutil.rmtree(ctx.scratch / "refused-node", ignore_errors=True)
        shutil.rmtree(tampered, ignore_errors=True)
    if code == 0:
        raise StepError("the tampered bundle was imported")
    return Step("refused", side, None, left)


# ------------------------------------------------------------------ stick -> store, verify


def copy_child(store: Path, medium: Path, keys: Path) -> None:
    from nodeagent import logs  # noqa: PLC0415
    from nodeagent.adapters.store.copier import copy_bundle  # noqa: PLC0415
    from nodeagent.bundles.manifest import parse_manifest  # noqa: PLC0415

    logs.configure("warning")  # stderr; stdout is the result
    started = time.monotonic()
    manifest = parse_manifest((medium / "bundle.json").read_bytes())
    result = copy_bundle(store, medium, manifest, keys)
    took = {"copy_bundle_s": time.monotonic() - started, "blobs": result.blobs_copied}
    print(json.dumps({"bytes_copied": result.bytes_copied} | took))


def step_copy(ctx: Context, media: Media, node: Node, throttle_mbps: float) -> Step:
    """The stick-to-store copy (``copy_bundle``, in a child) vs a raw read of the medium."""
    raw = measure_raw(media)
    base = Side("raw read of the medium, 16 MiB reads", raw.wall_s, {}, 0)
    cmd = [sys.executable, "-m", "bench.scale_steps", "copy", str(node.store),
           str(media.mountpoint), str(node.agent.trusted_keys_dir)]  # fmt: skip
    before = sectors_read(media.devnode)
    side, out = timed(ctx, "copy_bundle, stick -> store", lambda: run(cmd, what="copy"))
    child = json.loads(str(out).strip().splitlines()[-1])
    extra: dict[str, Any] = {
        "device_bytes_over_bundle": (sectors_read(media.devnode) - before) * 512 / media.size_bytes,
        "bytes_copied": child["bytes_copied"],
        "copy_bundle_s": child["copy_bundle_s"],  # the rest: the interpreter and imports
        "blobs": child["blobs"],
        "sha256_from_memory_s": measure_hash(child["bytes_copied"]).seconds,
        # the same sizes written from memory to the store's filesystem, each file fsynced
        # and renamed (bench/store_copy.py's (b)): the floor of a careful copy on this disk
        "raw_write_fsync_s": measure_write(Loop(media.devnode, media.mountpoint),
                                           ctx.scratch).seconds,
    }  # fmt: skip
    if throttle_mbps:
        extra |= throttled_copy(ctx, media, node, cmd, throttle_mbps)
    return Step("copy", side, base, extra)


def throttled_copy(
    ctx: Context, media: Media, node: Node, cmd: list[str], mbps: float
) -> dict[str, float]:
    """Read and copy again with this process (and its children) held to ``mbps`` MB/s."""
    shutil.rmtree(node.store)
    with throttled_reads(os.getpid(), media.devnode, int(mbps * 1_000_000)):
        read_s = measure_raw(media).wall_s
        side, _ = timed(ctx, "copy throttled", lambda: run(cmd, what="copy"))
    return {"throttled_mbps": mbps, "throttled_read_s": read_s,
            "throttled_copy_s": side.seconds,
            "throttled_copy_over_read": side.seconds / read_s}  # fmt: skip


def step_verify(ctx: Context, node: Node) -> Step:
    """``nodeagent store verify`` vs ``openssl dgst -sha256`` over the same blob files."""
    cmd = nodeagent_cmd(node.agent.config_file, "store", "verify", "--json")
    side, out = timed(ctx, "nodeagent store verify", lambda: run(cmd, what="store verify"))
    report = json.loads(str(out)[str(out).index("{") :])
    blobs = sorted(str(p) for p in (node.store / "blobs").rglob("*") if p.is_file())
    base, _ = timed(ctx, "openssl dgst -sha256", lambda: run([*SHA_CMD, *blobs], what="openssl"))
    if not report.get("ok") or report.get("checkedBlobs") != len(blobs):
        raise StepError(f"store verify: {report} over {len(blobs)} blob files")
    extra = {"blobs": len(blobs), "bytes": report["checkedBytes"],
             "verify_own_s": report["seconds"]}  # fmt: skip
    return Step("verify", side, base, extra)


# ------------------------------------------------------------------ import, restore, skopeo


def step_import(ctx: Context, media: Media, node: Node) -> Step:
    """``bundle import`` from the stick into a fresh CRI-O, to exit 0 (the set pinned)."""
    cmd = nodeagent_cmd(node.agent.config_file, "bundle", "import", str(media.mountpoint))
    started = time.monotonic()
    side, outcome = timed(ctx, "nodeagent bundle import",
                          lambda: run_stamped([*cmd, "--json"], node.agent.env()),
                          from_empty=True)  # fmt: skip
    code, _out, lines = outcome
    if ctx.logs is not None:
        ctx.logs.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{stamp - started:9.3f} {line}\n" for stamp, line in lines)
        (ctx.logs / f"import-{ctx.label}.log").write_text(text)
        shutil.copyfile(node.crio.log_path, ctx.logs / f"crio-import-{ctx.label}.log")
    if code != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise StepError(f"bundle import exited {code}:\n{tail}")
    pinned = asyncio.run(pinned_refs(node.crio.endpoint, media.refs))
    if pinned != media.refs:
        raise StepError(f"{len(pinned)} of {len(media.refs)} images pinned after the import")
    extra: dict[str, Any] = import_profile(lines, started, started + side.seconds)
    extra |= crio_pulls(node.crio.log_path)
    extra["store_bytes"] = tree_bytes(node.store)
    extra["unpacked_bytes"] = tree_bytes(node.crio.storage_root)
    stored = next((t for t, line in lines if event_of(line) == "bundle_stored"), None)
    if stored is not None:
        extra["start_to_stored_s"] = stored - started
    return Step("import", side, None, extra)


def _field(line: str, name: str) -> float | None:
    match = re.search(rf"\b{name}=([0-9.]+)", line)
    return float(match[1]) if match else None


def import_profile(
    lines: list[tuple[float, str]], started: float, ended: float
) -> dict[str, float]:
    """Where the import's time went. The CLI prints its own lines at its end (decision
    0073), so only the session process's lines are stamped as they come; the rest is from
    the ``seconds=`` fields the lines carry."""
    stamps = {event_of(line): t for t, line in lines if event_of(line)}
    out: dict[str, float] = {}
    serving, stopped = stamps.get("bundle_server_started"), stamps.get("bundle_server_stopped")
    if serving is not None:
        out["start -> session serving (check, admit, copy, session start) s"] = serving - started
    if serving is not None and stopped is not None:
        out["session serving (mirror, reloads, pulls) s"] = stopped - serving
        out["session stopped -> exit (sets, sync, pins) s"] = ended - stopped
    pulls = [s for _, line in lines if event_of(line) == "image_pulled"
             if (s := _field(line, "seconds")) is not None]  # fmt: skip
    copied = [s for _, line in lines if event_of(line) == "store_copy_finished"
              if (s := _field(line, "seconds")) is not None]  # fmt: skip
    out["stick -> store copy (its seconds=) s"] = sum(copied)
    out["per-image pull s, sum over images"] = sum(pulls)
    out["pull retries"] = float(sum(1 for _, line in lines if "pull_retrying" in line))
    return out


def step_restore(ctx: Context, media: Media, node: Node) -> Step:
    """CRI-O SIGKILLed and wiped, the daemon started, CRI-O started: until all pinned."""
    failures: list[str] = []
    while True:
        peaks = ctx.peaks(from_empty=True)
        offset = node.crio.log_path.stat().st_size
        try:
            with peaks.watching():
                measure = measure_restore(node, media.refs)
            break
        except RuntimeError as err:  # CRI-O killed while it started: once more, said
            failures.append(str(err).splitlines()[0])
            progress(f"  restore failed: {failures[-1]}")
            if node.agent.process is not None:
                node.agent.stop()
            if len(failures) > 1:
                raise
    side = Side("restore after a wipe (CRI-O start -> all pinned)", measure.wall_s,
                peaks.rss_mib(), peaks.disk_bytes, peaks.anon_mib())  # fmt: skip
    tail = ctx.scratch / "crio-restore.log"
    with node.crio.log_path.open("rb") as log:
        log.seek(offset)
        tail.write_bytes(log.read())
    extra: dict[str, Any] = {"unpacked_bytes": tree_bytes(node.crio.storage_root),
                             "failed_attempts": len(failures)}  # fmt: skip
    if failures:
        extra["first_failure"] = failures[0]
    extra |= measure.extra
    extra |= crio_pulls(tail)
    tail.unlink()
    return Step("restore", side, None, extra)


def skopeo_storage(ctx: Context, media: Media, node: Node) -> Side:
    """``skopeo copy oci:STICK:REF containers-storage:REF`` with CRI-O's storage.conf, as many
    at once as the import's pull concurrency (the bundle pull policy's: ``pull.concurrency``,
    at most ``BUNDLE_PULLS_AT_ONCE``), into CRI-O's wiped storage."""
    wipe_runtime(node.crio, is_killed=False)
    parallel = min(PullSettings().concurrency, BUNDLE_PULLS_AT_ONCE)
    env = dict(os.environ, CONTAINERS_STORAGE_CONF=str(node.crio.storage_conf))
    policy = skopeo_policy(ctx.scratch)
    pairs = [(f"oci:{media.mountpoint}:{r}", f"containers-storage:{r}") for r in media.refs]
    side, _ = timed(ctx, f"skopeo copy oci:STICK -> containers-storage, {parallel} at once",
                    lambda: skopeo_copies(pairs, policy, env, parallel=parallel))  # fmt: skip
    stored = json.loads((node.crio.storage_root / "vfs-images" / "images.json").read_text())
    if len(stored) != len(media.refs):
        raise StepError(f"skopeo stored {len(stored)} of {len(media.refs)} images")
    return side


def node_steps(ctx: Context, media: Media, steps: set[str], throttle_mbps: float) -> list[Step]:
    """copy and verify on one node's store; import, restore and their skopeo on another."""
    found: list[Step] = []
    if steps & {"copy", "verify"}:
        # The copy and verify need no runtime.
        node = make_node(ctx.scratch / "copy-node", ctx.public_key, is_started=False)
        try:
            progress("step copy")
            found.append(step_copy(ctx, media, node, throttle_mbps))
            if "verify" in steps:
                progress("step verify")
                found.append(step_verify(ctx, node))
        finally:
            close_node(node)
            shutil.rmtree(ctx.scratch / "copy-node", ignore_errors=True)
    if steps & {"import", "restore"}:
        node = make_node(ctx.scratch / "node", ctx.public_key)
        try:
            progress("step import")
            found.append(step_import(ctx, media, node))
            if "restore" in steps:
                progress("step restore")
                found.append(step_restore(ctx, media, node))
            progress("baseline skopeo -> containers-storage")
            baseline = skopeo_storage(ctx, media, node)
            for step in found:
                if step.name in {"import", "restore"}:
                    step.baseline = baseline
        finally:
            close_node(node)
            shutil.rmtree(ctx.scratch / "node", ignore_errors=True)
    return found


if __name__ == "__main__":
    if sys.argv[1:2] == ["copy"] and len(sys.argv) == 5:
        copy_child(*(Path(a) for a in sys.argv[2:]))
    else:
        sys.exit("usage: python -m bench.scale_steps copy STORE MEDIUM TRUSTED_KEYS")
