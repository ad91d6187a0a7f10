"""The offline drill's facts, gathered from the host (implements ``offline.facts.FactSource``),
and its per-pod warning Events (implements ``offline.drill.PodWarnings``).

Each source is read on its own: one that fails (the runtime down, a file unreadable or
malformed, the API unreachable) becomes an ``OfflineCheckIncomplete`` finding naming it,
and the others are still read. Files are read within the parsers' bounds, blocking reads
in a worker thread. docs/offline.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from nodeagent.adapters.bundles.registries_d import RegistriesD
from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.files import list_files
from nodeagent.adapters.offline_mirror import mirror_facts
from nodeagent.bundles.signatures import ImageSignature, sigstore_findings
from nodeagent.cluster import kinds
from nodeagent.cluster.api import Obj
from nodeagent.config import Config
from nodeagent.errors import NodeAgentError
from nodeagent.offline import findings as f
from nodeagent.offline.facts import (
    Facts,
    KubeletImagePolicy,
    PinnedSet,
    PodImage,
    SignaturePolicy,
    SigstoreIssue,
)
from nodeagent.offline.findings import Finding, PodRef, finding
from nodeagent.offline.parsing import (
    MAX_KUBELET_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_POLICY_BYTES,
    kubelet_image_policy,
    pause_image_of,
    pods_from_api,
    pods_from_manifest,
    signature_policy,
)
from nodeagent.ports import RunningContainer, StoredImage
from nodeagent.specs import load_spec_dirs
from nodeagent.store import layout
from nodeagent.strict import MalformedInput, clip

MAX_STATIC_PODS: Final = 1000
"""Manifests read from the static pod directory (a node has a handful)."""
MAX_API_PODS: Final = 5000
"""Pods read for this node (the kubelet's default maximum is 110; OpenShift's 250)."""


class Runtime(Protocol):
    async def list_images(self) -> list[StoredImage]: ...

    async def list_containers(self) -> list[RunningContainer]: ...


PodLister = Callable[[], Awaitable[list[Obj]]]


class _Unreadable(Exception):
    pass


def read_bounded(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of ``path`` (None when absent); more than ``max_bytes`` is ``MalformedInput``."""
    try:
        with path.open("rb") as stream:
            data = stream.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _Unreadable(f"cannot read {clip(path, 200)}: {err.strerror}") from err
    if len(data) > max_bytes:
        raise MalformedInput(f"{clip(path, 200)} is more than {max_bytes} bytes")
    return data


def _incomplete(what: str, error: object) -> Finding:
    return finding(
        f.CHECK_INCOMPLETE,
        f"could not read {what}: {clip(error, 300)}",
        "fix what the message names; the checks that need it did not run",
        subject=what,
    )


class HostFacts:
    """Every fact the checks read, from this node."""

    def __init__(
        self,
        config: Config,
        runtime: Runtime,
        *,
        pods: PodLister | None = None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.pods = pods

    async def gather(self) -> Facts:
        problems: list[Finding] = []
        sets = await asyncio.to_thread(self._sets)
        images, containers = await self._runtime(problems)
        pause, pause_source = await asyncio.to_thread(self._pause)
        pods, pods_source = await self._pods(problems)
        kubelet = await asyncio.to_thread(self._kubelet, problems)
        policy = await asyncio.to_thread(self._policy, problems)
        refs = [ref for s in sets for ref in s.images]
        restorable = await asyncio.to_thread(self._restorable, refs, problems)
        held, sigstore = await asyncio.to_thread(self._signatures, refs, problems)
        stored, dropin = await asyncio.to_thread(
            mirror_facts, self.config, problems, store_is_empty=self._store_is_empty()
        )
        return Facts(
            sets=tuple(sets),
            images=images,
            containers=containers,
            pause_image=pause,
            pause_source=pause_source,
            pods=pods,
            pods_source=pods_source,
            kubelet=kubelet,
            signature_policy=policy,
            held_signatures=held,
            sigstore=sigstore,
            store_restorable=restorable,
            stored_digests=stored,
            mirror_dropin=dropin,
            problems=tuple(problems),
        )

    def _sets(self) -> list[PinnedSet]:
        """The valid sets of the spec files (an invalid one is the sync's ``SpecInvalid``)."""
        load = load_spec_dirs(self.config.spec_dirs())
        return [PinnedSet(s.name, tuple(str(ref) for ref in s.images)) for s in load.sets]

    async def _runtime(
        self, problems: list[Finding]
    ) -> tuple[tuple[StoredImage, ...] | None, tuple[RunningContainer, ...] | None]:
        try:
            images = tuple(await self.runtime.list_images())
            containers = tuple(await self.runtime.list_containers())
        except NodeAgentError as exc:
            problems.append(_incomplete("the runtime's images and containers", exc))
            return None, None
        return images, containers

    def _pause(self) -> tuple[str | None, str]:
        rt = self.config.runtime
        dropins = CrioDropins(
            rt.config_file, rt.config_dir, rt.transient_dropin_dir, rt.dropin_name
        )
        return pause_image_of(dropins.read_other_configs())

    async def _pods(self, problems: list[Finding]) -> tuple[tuple[PodImage, ...] | None, str]:
        if self.pods is None:
            where = str(self.config.offline.static_pod_dir)
            found = await asyncio.to_thread(self._static_pods, problems)
            return found, f"static pods in {where}"
        try:
            items = await self.pods()
            return tuple(pods_from_api(items[:MAX_API_PODS])), "api"
        except NodeAgentError as exc:
            problems.append(_incomplete("this node's pods from the API server", exc))
        except MalformedInput as exc:
            problems.append(_incomplete("this node's pods from the API server", exc))
        return None, "api"

    def _static_pods(self, problems: list[Finding]) -> tuple[PodImage, ...]:
        directory = self.config.offline.static_pod_dir
        found: list[PodImage] = []
        try:
            paths = [
                p for p in list_files(directory, recursive=False) if not p.name.startswith(".")
            ]
        except NodeAgentError as exc:
            problems.append(_incomplete(str(directory), exc))
            return ()
        for path in paths[:MAX_STATIC_PODS]:
            try:
                data = read_bounded(path, MAX_MANIFEST_BYTES)
                if data is not None:
                    found.extend(pods_from_manifest(data, source=str(path)))
            except (MalformedInput, _Unreadable) as exc:
                problems.append(_incomplete(f"static pod manifest {path}", exc))
        return tuple(found)

    def _kubelet(self, problems: list[Finding]) -> KubeletImagePolicy | None:
        files = self.config.offline.kubelet_config_files
        for path in files:
            try:
                data = read_bounded(path, MAX_KUBELET_CONFIG_BYTES)
                if data is not None:
                    return kubelet_image_policy(data, source=str(path))
            except (MalformedInput, _Unreadable) as exc:
                problems.append(_incomplete(f"the kubelet configuration {path}", exc))
                return None
        names = ", ".join(str(p) for p in files)
        problems.append(_incomplete("the kubelet configuration", f"none of {names} exists"))
        return None

    def _policy(self, problems: list[Finding]) -> SignaturePolicy | None:
        path = self.config.offline.signature_policy
        try:
            data = read_bounded(path, MAX_POLICY_BYTES)
            return None if data is None else signature_policy(data, source=str(path))
        except (MalformedInput, _Unreadable) as exc:
            problems.append(_incomplete(f"the signature policy {path}", exc))
            return None

    def _store_is_empty(self) -> bool:
        """No bundle or registry set was ever kept: nothing to restore, no signature held,
        and the store's modules (2 MiB resident) need not be loaded to say so."""
        root = self.config.store_dir
        return not any(_has_entries(root / name) for name in (layout.BUNDLES_DIR, layout.SETS_DIR))

    def _restorable(self, refs: Sequence[str], problems: list[Finding]) -> frozenset[str] | None:
        if self._store_is_empty():
            return frozenset()
        from nodeagent.adapters.store.copier import StoreLimits  # noqa: PLC0415  (first run)
        from nodeagent.adapters.store.node_store import NodeImageStore  # noqa: PLC0415

        config = self.config
        store = NodeImageStore(
            config.store_dir,
            config.bundles.trusted_keys_dir,
            StoreLimits(),
            fips_switch=config.bundles.fips_switch,
        )
        try:
            return frozenset(store.restorable(refs).refs)
        except (NodeAgentError, OSError) as exc:
            problems.append(_incomplete(f"the node's image store {config.store_dir}", exc))
            return None

    def _signatures(
        self, refs: Sequence[str], problems: list[Finding]
    ) -> tuple[frozenset[str] | None, tuple[SigstoreIssue, ...] | None]:
        """Pinned images whose carried signatures the store holds, and what in registries.d
        keeps CRI-O from reading them (docs/offline.md, "Image signatures")."""
        if self._store_is_empty():
            return frozenset(), ()
        from nodeagent.adapters.store.copier import StoreLimits  # noqa: PLC0415  (first run)
        from nodeagent.adapters.store.node_store import NodeImageStore  # noqa: PLC0415

        config = self.config
        store = NodeImageStore(
            config.store_dir,
            config.bundles.trusted_keys_dir,
            StoreLimits(),
            fips_switch=config.bundles.fips_switch,
        )
        try:
            carried = store.carried_signatures(refs)
        except (NodeAgentError, OSError) as exc:
            problems.append(
                _incomplete(f"the signatures in the node's store {config.store_dir}", exc)
            )
            return None, None
        return carried.held, sigstore_issues(config.runtime.registries_d_dir, carried.signatures)


def sigstore_issues(
    directory: Path, signatures: Sequence[ImageSignature]
) -> tuple[SigstoreIssue, ...]:
    """``bundles.signatures.sigstore_findings`` over the runtime's registries.d; a directory
    that cannot be read is ``RegistriesDInvalid`` (containers/image refuses it too)."""
    registries_d = RegistriesD(directory)
    try:
        scopes = registries_d.scopes()
    except NodeAgentError as exc:
        return (
            SigstoreIssue(
                f.REGISTRIES_D_INVALID,
                str(directory),
                clip(exc, 300),
                f"make {directory} readable: containers/image refuses a directory it cannot "
                "read, and then CRI-O pulls nothing",
            ),
        )
    found = sigstore_findings(signatures, scopes, directory=str(directory))
    return tuple(SigstoreIssue(i.code, i.subject, i.message, i.action) for i in found)


def api_pods(api: Any, node_name: str) -> PodLister:
    """This node's pods from the API server (field selector ``spec.nodeName``)."""

    async def listed() -> list[Obj]:
        items, _version = await api.list(kinds.POD, field_selector=f"spec.nodeName={node_name}")
        return list(items)

    return listed


class KubePodWarnings:
    """Warning Events about pods through the cluster adapter (``cluster.api.KubeApi``)."""

    def __init__(self, api: Any, node_name: str) -> None:
        self.api = api
        self.node_name = node_name

    async def warn(self, pod: PodRef, reason: str, message: str) -> None:
        await self.api.create(kinds.EVENT, pod_event(pod, reason, message, self.node_name))


def pod_event(pod: PodRef, reason: str, message: str, node_name: str) -> dict[str, Any]:
    """A core/v1 Warning Event about ``pod``, in its namespace, named once per pod uid."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = hashlib.sha256(f"{pod.uid}\0{reason}".encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name[:200]}.{digest}", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
        },
        "type": "Warning",
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "nodeagent", "host": node_name},
        "reportingComponent": "nodeagent",
        "reportingInstance": node_name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as listing:
            return any(True for _ in listing)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable: let the store's own reader say why
