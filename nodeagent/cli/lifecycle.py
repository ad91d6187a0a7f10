"""``nodeagent unpin SET`` and ``nodeagent bundle remove BUNDLE-ID`` (decision 0072).

``unpin`` removes a local or bundle set's spec file, as release retirement does
(``adapters.store.releases``): with the daemon running, its watch of the spec directories
starts the sync that unpins it; with no daemon (this command takes its pin lock), the
command runs that one sync itself (the drop-in rewritten, CRI-O reloaded), as ``bundle
import`` does. A set the cluster's API gives is refused (``SetFromApi``): the next sync
would pin it again. A local file that holds other sets too is refused (``SetFileShared``):
nodeagent never rewrites a file a person wrote.

``bundle remove`` removes a stored bundle's blobs (``adapters.store.removing``) once none of
its sets is pinned (``BundleSetsPinned``); its signed manifest and signature stay. It takes
the pin lock: beside a running daemon it is refused (``DaemonRunning``, 75), since the daemon
may be importing or serving those blobs.

A release bundle's set or blobs follow retirement's rules (``cluster.retirement.by_hand``):
never the current, desired or requested release, nothing while an upgrade is under way
(``ReleaseInUse``), and nothing when that cannot be read (``ReleaseStateUnknown``, 75).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from nodeagent import logs
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import (
    ApiUnreachable,
    BundleSetsPinned,
    DaemonRunning,
    LifecycleRefused,
    NodeAgentError,
    ReleaseInUse,
    ReleaseStateUnknown,
    SetFileShared,
    SetFromApi,
    SetNotFound,
)
from nodeagent.specs import SELF_SET, is_kept_always, load_spec_dirs
from nodeagent.strict import clip
from nodeagent.units import format_bytes

if TYPE_CHECKING:
    from nodeagent.cluster.rollout import Rollout, Waiting
    from nodeagent.releases import HeldRelease
    from nodeagent.store.layout import BundleRecord

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

ROLLOUT_TIMEOUT_S = 30.0
"""Reading ClusterVersion and the MachineConfigPools for a release's set, at most."""


def add_parser(sub: Subparsers) -> None:
    unpin = sub.add_parser(
        "unpin", help="unpin a local or bundle PinnedImageSet (remove its spec file)"
    )
    unpin.add_argument("set", metavar="SET", help="the PinnedImageSet's name")


def add_remove_parser(commands: Subparsers) -> None:
    remove = commands.add_parser(
        "remove", help="remove a stored bundle's blobs (its signed manifest stays)"
    )
    remove.add_argument("bundle_id", metavar="BUNDLE-ID", help="as `nodeagent store` lists it")


# ---------------------------------------------------------------- which set
@dataclass(frozen=True, slots=True)
class SetFile:
    name: str
    path: Path
    bundle_id: str | None
    """The stored bundle whose import wrote the file; None: a local file."""


def find_set(config: Config, name: str) -> SetFile:
    """The spec file that gives set ``name``, or the refusal that says why not."""
    from nodeagent.adapters.store.records import StoreRecords  # noqa: PLC0415
    from nodeagent.bundles.handover import set_file_name  # noqa: PLC0415

    if is_kept_always(name):
        raise LifecycleRefused(
            f"PinnedImageSet {name} keeps the nodeagent image this node runs (decision 0074): "
            "it is never unpinned"
        )
    load = load_spec_dirs(config.spec_dirs())
    found = [s for s in load.sets if s.name == name]
    if not found:
        raise SetNotFound(
            f"no spec directory holds a PinnedImageSet {clip(name, 253)} "
            "(`nodeagent status` lists the sets)"
        )
    path = Path(found[0].source)
    if config.cluster.enabled and path.parent == config.cluster_specs_dir:
        raise SetFromApi(
            f"PinnedImageSet {clip(name, 253)} comes from the cluster's API: unpinned here, "
            "the next sync would pin it again"
        )
    records = StoreRecords(config.store_dir).load(is_repairing=False).records
    for record in records:
        if not record.is_registry and path.name == set_file_name(record.bundle_id, name):
            return SetFile(name, path, record.bundle_id)
    others = sorted({s.name for s in load.sets if s.source == found[0].source} - {name})
    if others:
        raise SetFileShared(
            f"{path} holds other sets too ({clip(', '.join(others), 300)}); nodeagent does not "
            "rewrite a file a person wrote"
        )
    return SetFile(name, path, None)


# ---------------------------------------------------------------- release rules
def held_release(config: Config, bundle_id: str) -> HeldRelease | None:
    from nodeagent.adapters.store.releases import StoredReleases  # noqa: PLC0415

    dirs = [d for d, _ in config.spec_dirs()]
    held = StoredReleases(config.store_dir, dirs).held()
    return next((h for h in held if h.bundle_id == bundle_id), None)


async def read_rollout(config: Config) -> Rollout | Waiting:
    """Where the cluster's upgrade stands (``cluster.rollout``), read once."""
    from nodeagent.adapters.kube import KubeApi  # noqa: PLC0415  (lightkube: cluster only)
    from nodeagent.cluster import kinds  # noqa: PLC0415
    from nodeagent.cluster.clusterversion import CLUSTER_VERSION_NAME  # noqa: PLC0415
    from nodeagent.cluster.objects import FIELD_MANAGER  # noqa: PLC0415
    from nodeagent.cluster.rollout import rollout  # noqa: PLC0415

    api = KubeApi(
        config.cluster.kubeconfig,
        timeout_s=config.cluster.request_timeout_s,
        field_manager=FIELD_MANAGER,
    )
    try:
        async with asyncio.timeout(ROLLOUT_TIMEOUT_S):
            fields = f"metadata.name={CLUSTER_VERSION_NAME}"  # list, as retirement reads it
            found, _ = await api.list(kinds.CLUSTER_VERSION, field_selector=fields)
            cv = found[0] if found else None
            pools = None
            if await api.is_served(kinds.MACHINE_CONFIG_POOL):
                pools, _ = await api.list(kinds.MACHINE_CONFIG_POOL)
    except TimeoutError as err:
        raise ApiUnreachable(f"no answer from {api.server} in {ROLLOUT_TIMEOUT_S:.0f} s") from err
    finally:
        await api.close()
    return rollout(cv, pools)


def check_release(config: Config, bundle_id: str) -> None:
    """Refuse when ``bundle_id`` is a release bundle that may not go now."""
    from nodeagent.cluster.retirement import (  # noqa: PLC0415
        RELEASE_IN_USE,
        by_hand,
    )

    held = held_release(config, bundle_id)
    if held is None:
        return
    if not config.cluster.enabled:
        raise ReleaseStateUnknown(
            f"bundle {bundle_id} carries release {clip(held.version, 64)} and this node is not "
            "in cluster mode, so whether the cluster runs it cannot be read"
        )
    try:
        state = asyncio.run(read_rollout(config))
    except NodeAgentError as exc:
        raise ReleaseStateUnknown(
            f"bundle {bundle_id} carries release {clip(held.version, 64)}: the cluster's "
            f"upgrade state could not be read ({exc.reason}: {exc.message})"
        ) from exc
    refusal = by_hand(state, held)
    if refusal is not None:
        reason, message = refusal
        raise (ReleaseInUse if reason == RELEASE_IN_USE else ReleaseStateUnknown)(message)


# ---------------------------------------------------------------- unpin
def cmd_unpin(config: Config, args: argparse.Namespace) -> int:
    logs.configure(config.log.level)
    target = find_set(config, args.set)
    if target.bundle_id is not None:
        check_release(config, target.bundle_id)
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    is_ours = lock.try_acquire()
    source = "bundle" if target.bundle_id else "local"
    try:
        remove_file(target.path)
        if not args.json:  # said before the sync: a sync that fails leaves the file removed
            print(f"removed {target.path} ({source} set {clip(target.name, 253)})", flush=True)
        line = asyncio.run(_sync(config)) if is_ours else None
    finally:
        if is_ours:
            lock.release()
    if args.json:
        output.print_json("unpin", {
            "set": target.name, "source": source, "bundleId": target.bundle_id,
            "files": [str(target.path)], "by": "sync" if is_ours else "daemon", "sync": line,
        })  # fmt: skip
        return 0
    if line is None:
        print(
            "the running daemon unpins it at the sync its watch of the spec directories starts "
            "now (`nodeagent status` shows it)"
        )
    else:
        print(f"sync: {line}")
    return 0


def remove_file(path: Path) -> None:
    from nodeagent.adapters.files import remove_file as remove  # noqa: PLC0415

    remove(path)


async def _sync(config: Config) -> str:
    """One sync, as ``bundle import`` runs it (the drop-in rewritten, CRI-O reloaded)."""
    from nodeagent.daemon.wiring import build  # noqa: PLC0415  (CRI, ledger: this command only)
    from nodeagent.status import status_line  # noqa: PLC0415

    wiring = build(config)
    try:
        status = await wiring.reconciler.sync()
        wiring.reporter.sync_finished(status)
        return status_line(status)
    finally:
        await wiring.close()


# ---------------------------------------------------------------- bundle remove
def refuse_running_image(record: BundleRecord) -> None:
    """``LifecycleRefused`` for the bundle holding the image nodeagent runs now (the set
    ``nodeagent-self`` keeps it, decision 0074)."""
    from nodeagent.adapters.bundles.agent_image import self_digests  # noqa: PLC0415

    running = self_digests(os.environ)
    if any(image.digest in running for image in record.images):
        raise LifecycleRefused(
            f"bundle {record.bundle_id} holds the nodeagent image this node runs "
            f"(kept by {SELF_SET}, decision 0074): it is never removed"
        )


def cmd_remove(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.store import removing  # noqa: PLC0415
    from nodeagent.cli.store import pinned_sets  # noqa: PLC0415

    logs.configure(config.log.level)
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    if not lock.try_acquire():
        raise DaemonRunning(
            f"the nodeagent daemon (process {lock.holder()}) is running and may be importing "
            "or serving the bundle's blobs"
        )
    try:
        record = removing.stored_bundle(config.store_dir, args.bundle_id)
        refuse_running_image(record)
        in_files = {s.name for s in load_spec_dirs(config.spec_dirs()).sets}
        now_pinned = pinned_sets(config) | in_files
        pinned = sorted(set(record.sets) & now_pinned)
        if pinned:
            raise BundleSetsPinned(
                f"bundle {record.bundle_id}'s set {clip(', '.join(pinned), 300)} is pinned "
                "(or its spec file is still there)"
            )
        check_release(config, record.bundle_id)
        removed = removing.remove_bundle_blobs(config.store_dir, record.bundle_id, now_pinned)
    finally:
        lock.release()
    doc: dict[str, Any] = {
        "bundleId": removed.bundle_id, "removedBlobs": removed.removed_blobs,
        "freedBytes": removed.freed_bytes, "keptBlobs": removed.kept_blobs,
        "keptBytes": removed.kept_bytes, "absentBlobs": removed.absent_blobs,
        "manifestKept": True,
    }  # fmt: skip
    if args.json:
        output.print_json("bundle-remove", doc)
        return 0
    sys.stdout.write(
        f"removed {removed.removed_blobs} blobs of bundle {removed.bundle_id}, "
        f"{format_bytes(removed.freed_bytes)} freed; {removed.kept_blobs} blobs "
        f"({format_bytes(removed.kept_bytes)}) kept, shared with other bundles or sets; "
        "its signed manifest and signature stay (anti-rollback)\n"
    )
    return 0
