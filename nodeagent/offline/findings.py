"""A finding of the drill, the report of one run, and the ``OfflineReady`` condition (pure).

Every finding has a reason code of its own (the table in docs/offline.md), a message
clipped and escaped (it quotes image names, pod names and file contents, which anyone who
can create a pod or edit a file chooses) and what to do. A run with no finding is
offline-ready; anything the drill could not learn is a finding too (``OfflineCheckIncomplete``),
never counted as fine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.status import Condition
from nodeagent.strict import clip

MAX_MESSAGE_CHARS: Final = 600
"""One finding's message (it names an image, a pod or a file, each clipped on its own)."""
MAX_SUBJECT_CHARS: Final = 500
MAX_FINDINGS_PER_REASON: Final = 50
"""Findings of one reason kept in a report; the rest are counted in one more finding."""
CONDITION_TYPE: Final = "OfflineReady"

# Reason codes, one per finding (docs/offline.md lists each with what to do).
PINNED_IMAGE_MISSING: Final = "PinnedImageMissing"
PINNED_IMAGE_NOT_PINNED: Final = "PinnedImageNotPinned"
PAUSE_IMAGE_UNKNOWN: Final = "PauseImageUnknown"
PAUSE_IMAGE_MISSING: Final = "PauseImageMissing"
PAUSE_IMAGE_NOT_PINNED: Final = "PauseImageNotPinned"
CONTAINER_IMAGE_MISSING: Final = "ContainerImageMissing"
CONTAINER_IMAGE_NOT_PINNED: Final = "ContainerImageNotPinned"
POD_PULLS_ALWAYS: Final = "PodPullsAlways"
POD_IMAGE_BY_TAG: Final = "PodImageByTag"
KUBELET_VERIFIES_PRELOADED: Final = "KubeletVerifiesPreloadedImages"
SIGNATURES_REQUIRED: Final = "SignaturesRequired"
STORE_LACKS_IMAGE: Final = "StoreLacksImage"
SIGSTORE_ATTACHMENTS_OFF: Final = "SigstoreAttachmentsOff"
REGISTRIES_D_INVALID: Final = "RegistriesDInvalid"
CHECK_INCOMPLETE: Final = "OfflineCheckIncomplete"
MORE_FINDINGS: Final = "MoreFindings"


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a finding is about (for its Event): namespace, name, uid."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Finding:
    reason: str
    message: str
    remedy: str
    subject: str = ""
    """What it is about (an image, a pod, a file), for scripts; clipped."""
    pod: PodRef | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"reason": self.reason, "message": self.message}
        doc["remedy"] = self.remedy
        if self.subject:
            doc["subject"] = self.subject
        if self.pod is not None:
            doc["pod"] = {"namespace": self.pod.namespace, "name": self.pod.name}
        return doc


def clipped(text: object, limit: int) -> str:
    """``strict.clip`` within ``limit`` characters, its "…(n more characters)" included."""
    shown = clip(text, limit)
    return shown if len(shown) <= limit else clip(text, limit - 32)


def finding(
    reason: str, message: str, remedy: str, *, subject: str = "", pod: PodRef | None = None
) -> Finding:
    """A finding with its message and subject clipped and escaped."""
    return Finding(
        reason,
        clipped(message, MAX_MESSAGE_CHARS),
        remedy,
        clipped(subject, MAX_SUBJECT_CHARS) if subject else "",
        pod,
    )


def bounded(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """At most ``MAX_FINDINGS_PER_REASON`` of each reason, plus one finding counting the rest."""
    kept: list[Finding] = []
    counts: dict[str, int] = {}
    for item in findings:
        counts[item.reason] = counts.get(item.reason, 0) + 1
        if counts[item.reason] <= MAX_FINDINGS_PER_REASON:
            kept.append(item)
    for reason, count in counts.items():
        if count > MAX_FINDINGS_PER_REASON:
            more = count - MAX_FINDINGS_PER_REASON
            kept.append(
                Finding(
                    MORE_FINDINGS,
                    f"{more} more {reason} finding(s) not listed",
                    "fix those listed and run the check again",
                    reason,
                )
            )
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class OfflineReport:
    """One run of the drill: its findings (bounded) and the checks that ran."""

    findings: tuple[Finding, ...]
    checks: tuple[str, ...]

    @property
    def is_ready(self) -> bool:
        return not self.findings

    def reasons(self) -> list[str]:
        return sorted({f.reason for f in self.findings})

    def to_json(self) -> dict[str, Any]:
        return {
            "offlineReady": self.is_ready,
            "checks": list(self.checks),
            "findings": [f.to_json() for f in self.findings],
        }

    def condition(self) -> Condition:
        """``OfflineReady``: True with no finding, else False with the first reason."""
        if self.is_ready:
            return Condition(
                CONDITION_TYPE, True, "AllChecksPassed", f"{len(self.checks)} checks passed"
            )
        first = self.findings[0]
        reasons = self.reasons()
        message = f"{len(self.findings)} finding(s) ({', '.join(reasons)}): {first.message}"
        return Condition(CONDITION_TYPE, False, first.reason, clipped(message, MAX_MESSAGE_CHARS))


def report_of(checks: Sequence[str], findings: Iterable[Finding]) -> OfflineReport:
    return OfflineReport(bounded(findings), tuple(checks))
