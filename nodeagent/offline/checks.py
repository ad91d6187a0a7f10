"""The drill's checks: one pure function per finding family, over ``Facts``.

``CHECKS`` lists them by name; a new check (the bundle-signature feature's
``registries.d`` check, for one) joins the tuple and nothing else changes. A check whose
fact is unknown (None) returns nothing: the gatherer's ``OfflineCheckIncomplete`` finding
already says the drill could not look. docs/offline.md explains each reason code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from nodeagent.errors import ImageReferenceInvalid
from nodeagent.offline import findings as f
from nodeagent.offline.facts import Facts, KubeletImagePolicy
from nodeagent.offline.findings import Finding, OfflineReport, finding, report_of
from nodeagent.offline.lookup import find_image as find_image
from nodeagent.offline.lookup import image_index as image_index
from nodeagent.offline.lookup import pinned_refs as pinned_refs
from nodeagent.offline.mirror_checks import check_mirror_dropin, check_pods_held
from nodeagent.offline.parsing import requires_signature
from nodeagent.registries import parse_docker_reference

Check = Callable[[Facts], Iterable[Finding]]

SAFE_POLICIES: Final = frozenset({"NeverVerify", "NeverVerifyPreloadedImages"})
"""KEP-2535 policies under which an image the kubelet did not pull itself (nodeagent's,
pulled through CRI-O) is used without asking a registry (docs/runtime-facts.md)."""


# ---------------------------------------------------------------- 1. sets
def check_pinned_sets(facts: Facts) -> Iterator[Finding]:
    if facts.sets is None or facts.images is None:
        return
    index = image_index(facts.images)
    for pinned_set in facts.sets:
        for ref in pinned_set.images:
            image = find_image(index, ref)
            if image is None:
                yield finding(
                    f.PINNED_IMAGE_MISSING,
                    f"PinnedImageSet {pinned_set.name}: {ref} is not in the runtime's store",
                    "let the sync pull it (nodeagent status says why it has not) or import "
                    "the bundle that carries it, while the registry is still there",
                    subject=ref,
                )
            elif not image.is_pinned:
                yield finding(
                    f.PINNED_IMAGE_NOT_PINNED,
                    f"PinnedImageSet {pinned_set.name}: {ref} is present but CRI-O does not "
                    "report it pinned: its image garbage collection may remove it",
                    "see nodeagent status (PinsOverridden, RuntimeDoesNotPin) and docs/pins.md",
                    subject=ref,
                )


# ---------------------------------------------------------------- 2. pause image
def check_pause_image(facts: Facts) -> Iterator[Finding]:
    if facts.images is None:
        return
    if facts.pause_image is None:
        yield finding(
            f.PAUSE_IMAGE_UNKNOWN,
            "no CRI-O configuration file sets [crio.image] pause_image, so the drill cannot "
            "tell which pause image every pod needs",
            "set pause_image in a CRI-O drop-in (OpenShift's machine config does) to the "
            "image by digest",
        )
        return
    image = find_image(image_index(facts.images), facts.pause_image)
    where = f" (set in {facts.pause_source})" if facts.pause_source else ""
    if image is None:
        yield finding(
            f.PAUSE_IMAGE_MISSING,
            f"CRI-O's pause image {facts.pause_image}{where} is not in the runtime's store: "
            "no new pod can start without the registry",
            "pull it now (nodeagent pull IMAGE) and put it in a PinnedImageSet or a bundle",
            subject=facts.pause_image,
        )
    elif not image.is_pinned:
        yield finding(
            f.PAUSE_IMAGE_NOT_PINNED,
            f"CRI-O's pause image {facts.pause_image}{where} is present but not pinned",
            "CRI-O pins its configured pause_image itself: check that the name matches the "
            "stored one, or add it to a PinnedImageSet",
            subject=facts.pause_image,
        )


# ---------------------------------------------------------------- 3. running containers
def check_container_images(facts: Facts) -> Iterator[Finding]:
    if facts.containers is None or facts.images is None:
        return
    index = image_index(facts.images)
    reported: set[str] = set()
    for container in facts.containers:
        image = find_image(index, container.image_ref) or find_image(index, container.image)
        key = image.id if image is not None else container.image
        if key in reported:
            continue
        where = f"{container.pod_namespace}/{container.pod_name}" if container.pod_name else ""
        who = f"container {container.name}" + (f" of pod {where}" if where else "")
        if image is None:
            reported.add(key)
            yield finding(
                f.CONTAINER_IMAGE_MISSING,
                f"{who} runs {container.image}, which the runtime no longer stores: a "
                "restart needs the registry",
                "pull it by digest and put it in a PinnedImageSet or a bundle",
                subject=container.image,
            )
        elif not image.is_pinned:
            reported.add(key)
            yield finding(
                f.CONTAINER_IMAGE_NOT_PINNED,
                f"{who} runs {container.image}, which no pin covers: image garbage "
                "collection may remove it, and then a restart needs the registry",
                "add the image by digest to a PinnedImageSet (or a bundle's set)",
                subject=container.image,
            )


# ---------------------------------------------------------------- 4. pods
def _has_digest(image: str) -> bool:
    try:
        return parse_docker_reference(image).digest is not None
    except ImageReferenceInvalid:
        return False


def check_pod_images(facts: Facts) -> Iterator[Finding]:
    for pod_image in facts.pods or ():
        pod = pod_image.pod
        who = f"pod {pod.namespace}/{pod.name} container {pod_image.container}"
        if pod_image.source != "api":
            who += f" ({pod_image.source})"
        if pod_image.pull_policy == "Always":
            yield finding(
                f.POD_PULLS_ALWAYS,
                f"{who} has imagePullPolicy Always ({pod_image.image}): the kubelet asks the "
                "registry every time the container starts, and fails without it",
                "set imagePullPolicy: IfNotPresent and name the image by digest",
                subject=pod_image.image,
                pod=pod,
            )
        if not _has_digest(pod_image.image):
            yield finding(
                f.POD_IMAGE_BY_TAG,
                f"{who} names {pod_image.image} by tag, not by digest: no PinnedImageSet "
                "can cover it for certain, and a new tag needs the registry",
                "name the image by digest (image@sha256:...) and pin that digest",
                subject=pod_image.image,
                pod=pod,
            )


# ---------------------------------------------------------------- 5. kubelet
def _repository(ref: str) -> str:
    """``host/path`` of a reference, without tag or digest (what the allowlist matches)."""
    name = ref.partition("@")[0]
    if name.rfind(":") > name.rfind("/"):
        name = name.rpartition(":")[0]
    return name


def _allowlisted(allowlist: Sequence[str], ref: str) -> bool:
    repository = _repository(ref)
    for pattern in allowlist:
        if pattern.endswith("/*"):
            if repository.startswith(pattern[:-1]):
                return True
        elif repository == pattern:
            return True
    return False


def _kubelet_findings(kubelet: KubeletImagePolicy, refs: Sequence[str]) -> Iterator[Finding]:
    policy = kubelet.policy
    where = f"{kubelet.source}: imagePullCredentialsVerificationPolicy {policy}"
    remedy = (
        "set imagePullCredentialsVerificationPolicy: NeverVerifyPreloadedImages (the "
        "default) in the kubelet configuration, or list the pinned repositories in "
        "preloadedImagesVerificationAllowlist"
    )
    if policy == "AlwaysVerify":
        yield finding(
            f.KUBELET_VERIFIES_PRELOADED,
            f"{where}: the kubelet checks every pod's credentials at the registry, even for "
            "images pre-loaded on the node, so pods do not start without the registry",
            remedy,
            subject=kubelet.source,
        )
    elif policy == "NeverVerifyAllowlistedImages":
        for ref in refs:
            if not _allowlisted(kubelet.allowlist, ref):
                yield finding(
                    f.KUBELET_VERIFIES_PRELOADED,
                    f"{where}: {ref} is not in preloadedImagesVerificationAllowlist, so the "
                    "kubelet checks credentials for it at the registry",
                    remedy,
                    subject=ref,
                )
    else:
        yield finding(
            f.CHECK_INCOMPLETE,
            f"{where} is not a policy this drill knows (nor, probably, the kubelet)",
            "use one of NeverVerify, NeverVerifyPreloadedImages, "
            "NeverVerifyAllowlistedImages, AlwaysVerify",
            subject=kubelet.source,
        )


def check_kubelet_policy(facts: Facts) -> Iterator[Finding]:
    kubelet = facts.kubelet
    if kubelet is None or kubelet.is_gate_on is False:
        return  # unknown (a finding says so already) or the feature is off: no verification
    if kubelet.policy is None or kubelet.policy in SAFE_POLICIES:
        return
    refs = pinned_refs(facts) + ([facts.pause_image] if facts.pause_image else [])
    yield from _kubelet_findings(kubelet, refs)


# ---------------------------------------------------------------- 6. signatures
def check_signatures(facts: Facts) -> Iterator[Finding]:
    policy, held = facts.signature_policy, facts.held_signatures
    if policy is None or held is None:
        return
    for ref in pinned_refs(facts):
        scope, is_required = requires_signature(policy, ref)
        if is_required and ref not in held:
            yield finding(
                f.SIGNATURES_REQUIRED,
                f"{policy.source} requires signatures for {ref} (scope {scope}) and the node "
                "holds none for it: a pull to restore it fails without the registry",
                "carry the image's signatures in a bundle (bundle create --with-signatures), "
                "or relax the policy for that scope",
                subject=ref,
            )


# ---------------------------------------------------------------- 7. registries.d
SIGSTORE_REASONS: Final = frozenset({f.SIGSTORE_ATTACHMENTS_OFF, f.REGISTRIES_D_INVALID})


def check_sigstore_attachments(facts: Facts) -> Iterator[Finding]:
    """Each pinned image a bundle carried a sigstore signature for must be read with it:
    ``use-sigstore-attachments: true`` for its registry, in a registries.d CRI-O accepts."""
    for issue in facts.sigstore or ():
        reason = issue.reason if issue.reason in SIGSTORE_REASONS else f.REGISTRIES_D_INVALID
        yield finding(reason, issue.message, issue.remedy, subject=issue.subject)


# ---------------------------------------------------------------- 8. store
def check_store(facts: Facts) -> Iterator[Finding]:
    if facts.store_restorable is None:
        return
    for ref in pinned_refs(facts):
        if ref not in facts.store_restorable:
            yield finding(
                f.STORE_LACKS_IMAGE,
                f"the node's image store does not hold every blob of {ref}: if CRI-O loses "
                "its images (an unclean power cut), this one cannot come back without the "
                "registry",
                "import a bundle that carries it, or set [store] registry_sets = true while "
                "the registry is reachable (docs/store.md)",
                subject=ref,
            )


CHECKS: Final[tuple[tuple[str, Check], ...]] = (
    ("pinned-sets", check_pinned_sets),
    ("pause-image", check_pause_image),
    ("running-containers", check_container_images),
    ("pod-pull-policies", check_pod_images),
    ("kubelet-credential-verification", check_kubelet_policy),
    ("signature-policy", check_signatures),
    ("sigstore-attachments", check_sigstore_attachments),
    ("node-store", check_store),
    ("pod-images-held", check_pods_held),
    ("node-mirror-dropin", check_mirror_dropin),
)


def run_checks(facts: Facts, checks: Sequence[tuple[str, Check]] = CHECKS) -> OfflineReport:
    """Every check over ``facts``; the gatherer's problems come first."""
    found: list[Finding] = list(facts.problems)
    for _name, check in checks:
        found.extend(check(facts))
    return report_of([name for name, _check in checks], found)
