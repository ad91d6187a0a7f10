"""From hostile bytes to the drill's facts: pods, the kubelet's configuration, the signature
policy, CRI-O's pause image (pure; docs/runtime-facts.md for the rules followed).

Each parser is bounded (``strict``: size, depth, linear time) and strict about shapes: a
document that is not of the expected form raises ``MalformedInput`` with a clipped message,
and the gatherer turns it into an ``OfflineCheckIncomplete`` finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from nodeagent.offline.facts import KubeletImagePolicy, PodImage, SignaturePolicy
from nodeagent.offline.findings import PodRef
from nodeagent.pins import MAX_RUNTIME_CONFIG_BYTES, ConfigFile
from nodeagent.strict import MalformedInput, clip, load_yaml, loads_json, loads_toml

MAX_MANIFEST_BYTES: Final = 1024 * 1024
"""One static pod manifest (the API server's own object limit is 1.5 MiB; a manifest is KBs)."""
MAX_KUBELET_CONFIG_BYTES: Final = 1024 * 1024
MAX_POLICY_BYTES: Final = 4 * 1024 * 1024
MAX_DEPTH: Final = 32
MAX_NODES: Final = 100_000
MAX_CONTAINERS: Final = 1000
"""Containers of one pod read (the API validates no such bound; 1000 is far beyond any pod)."""
MAX_TEXT: Final = 4096
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
SIGNATURE_TYPES: Final = frozenset({"signedBy", "sigstoreSigned"})
"""containers-policy.json(5) requirement types that need a signature."""
GATE: Final = "KubeletEnsureSecretPulledImages"


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise MalformedInput(f"{what} is not a string of at most {MAX_TEXT} characters")
    return value


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MalformedInput(f"{what} is not an object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedInput(f"{what} is not a list")
    return value


# ---------------------------------------------------------------- pods
def default_pull_policy(image: str) -> str:
    """Kubernetes' default: ``Always`` for ``:latest`` or no tag (and no digest), else
    ``IfNotPresent`` (docs/runtime-facts.md)."""
    if "@" in image:
        return "IfNotPresent"
    name = image.rsplit("/", 1)[-1]
    tag = name.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_images(pod: object, *, source: str) -> list[PodImage]:
    """Every container (init containers too) of one Pod object with its image and policy."""
    doc = _mapping(pod, "the pod")
    meta = _mapping(doc.get("metadata") or {}, "metadata")
    spec = _mapping(doc.get("spec") or {}, "spec")
    ref = PodRef(
        _text(meta.get("namespace") or "default", "metadata.namespace"),
        _text(meta.get("name") or "", "metadata.name"),
        _text(meta.get("uid") or "", "metadata.uid"),
    )
    found = []
    for key in ("initContainers", "containers"):
        containers = _list(spec.get(key), f"spec.{key}")
        if len(containers) > MAX_CONTAINERS:
            raise MalformedInput(f"spec.{key} has {len(containers)} entries")
        for index, item in enumerate(containers):
            found.append(_pod_image(ref, item, f"spec.{key}[{index}]", source))
    return found


def _pod_image(ref: PodRef, item: object, where: str, source: str) -> PodImage:
    container = _mapping(item, where)
    image = _text(container.get("image") or "", f"{where}.image")
    policy = container.get("imagePullPolicy") or default_pull_policy(image)
    if policy not in PULL_POLICIES:
        raise MalformedInput(
            f"{where}.imagePullPolicy {clip(policy, 40)} is not one of Kubernetes'"
        )
    name = _text(container.get("name") or "", f"{where}.name")
    return PodImage(ref, name, image, str(policy), source)


def pods_from_api(items: Iterable[object]) -> list[PodImage]:
    """Pods as the API server lists them (defaults applied); pods that ended are left out."""
    found: list[PodImage] = []
    for item in items:
        phase = _mapping(_mapping(item, "a pod").get("status") or {}, "status").get("phase")
        if phase in ("Succeeded", "Failed"):
            continue
        found.extend(pod_images(item, source="api"))
    return found


def pods_from_manifest(data: bytes, *, source: str) -> list[PodImage]:
    """The Pods of one static pod manifest (YAML or JSON; other kinds are ignored)."""
    docs = load_yaml(
        data,
        what=clip(source, 200),
        max_bytes=MAX_MANIFEST_BYTES,
        max_depth=MAX_DEPTH,
        max_nodes=MAX_NODES,
    )
    found: list[PodImage] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Pod":
            found.extend(pod_images(doc, source=source))
    return found


# ---------------------------------------------------------------- kubelet
def kubelet_image_policy(data: bytes, *, source: str) -> KubeletImagePolicy:
    """The KEP-2535 settings of a KubeletConfiguration file (YAML or JSON)."""
    docs = load_yaml(
        data,
        what=clip(source, 200),
        max_bytes=MAX_KUBELET_CONFIG_BYTES,
        max_depth=MAX_DEPTH,
        max_nodes=MAX_NODES,
    )
    if len(docs) != 1:
        raise MalformedInput(f"{clip(source, 200)} holds {len(docs)} documents, not one")
    doc = _mapping(docs[0], clip(source, 200))
    policy = doc.get("imagePullCredentialsVerificationPolicy")
    allowlist = _list(doc.get("preloadedImagesVerificationAllowlist"), "the allowlist")
    gates = _mapping(doc.get("featureGates") or {}, "featureGates")
    gate = gates.get(GATE)
    if gate is not None and not isinstance(gate, bool):
        raise MalformedInput(f"featureGates.{GATE} is not true or false")
    return KubeletImagePolicy(
        source,
        None if policy is None else _text(policy, "imagePullCredentialsVerificationPolicy"),
        tuple(_text(item, "an allowlist entry") for item in allowlist[:MAX_CONTAINERS]),
        gate,
    )


# ---------------------------------------------------------------- signature policy
def _types(requirements: object, what: str) -> tuple[str, ...]:
    items = _list(requirements, what)
    return tuple(_text(_mapping(r, what).get("type"), f"{what} type") for r in items)


def signature_policy(data: bytes, *, source: str) -> SignaturePolicy:
    """containers-policy.json(5): the requirement types of ``default`` and of each docker scope."""
    doc = _mapping(
        loads_json(data, what=clip(source, 200), max_bytes=MAX_POLICY_BYTES, max_depth=MAX_DEPTH),
        clip(source, 200),
    )
    transports = _mapping(doc.get("transports") or {}, "transports")
    docker = _mapping(transports.get("docker") or {}, "transports.docker")
    scopes = {scope: _types(reqs, f"scope {clip(scope, 80)}") for scope, reqs in docker.items()}
    return SignaturePolicy(source, _types(doc.get("default"), "default"), scopes)


def scope_candidates(ref: str) -> list[str]:
    """The docker scopes that may apply to ``host[:port]/path@digest``, most specific first:
    the reference, the repository, each parent namespace, the host, then ``*.domain``
    wildcards from the longest (containers-policy.json(5), "docker" scopes)."""
    name = ref.partition("@")[0]
    candidates = [ref, name]
    parts = name.split("/")
    candidates += ["/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
    host = parts[0].partition(":")[0]
    labels = host.split(".")
    candidates += ["*." + ".".join(labels[n:]) for n in range(1, len(labels))]
    return candidates


def requirement_types(policy: SignaturePolicy, ref: str) -> tuple[str, tuple[str, ...]]:
    """(the scope that applies to ``ref``, its requirement types)."""
    for scope in scope_candidates(ref):
        if scope in policy.docker_scopes:
            return scope, policy.docker_scopes[scope]
    if "" in policy.docker_scopes:
        return 'transports.docker ""', policy.docker_scopes[""]
    return "default", policy.default


def requires_signature(policy: SignaturePolicy, ref: str) -> tuple[str, bool]:
    scope, types = requirement_types(policy, ref)
    return scope, any(t in SIGNATURE_TYPES for t in types)


# ---------------------------------------------------------------- CRI-O
def pause_image_of(files: Sequence[ConfigFile]) -> tuple[str | None, str]:
    """``[crio.image] pause_image`` of the last file setting it (CRI-O's reading order), and
    that file; (None, "") when no file sets it. A file that is not TOML is skipped (CRI-O
    does not start with it; ``pins`` reports it)."""
    found: tuple[str | None, str] = (None, "")
    for file in files:
        try:
            doc = loads_toml(file.text, what=file.path, max_bytes=MAX_RUNTIME_CONFIG_BYTES)
            image = doc.get("crio", {}).get("image", {})
        except (MalformedInput, AttributeError):
            continue
        value = image.get("pause_image") if isinstance(image, dict) else None
        if isinstance(value, str) and value and len(value) <= MAX_TEXT:
            found = (value, file.path)
    return found
