"""The cluster's version as OpenShift's ClusterVersion says it (pure).

``parse_cluster_version`` turns a ClusterVersion object (``config.openshift.io/v1``, the one
named ``version``; decoded JSON as the API server returns it) into a frozen
``ClusterVersionView``: the current release, the desired update of the spec, the release the
cluster-version operator (CVO) works towards, the update history, the conditions. The shape
and the meaning of each field are openshift/api's (docs/runtime-facts.md, "ClusterVersion and
the cluster-version operator"):

* ``status.history[]`` is newest first; an entry is ``Partial`` while its update runs (or if it
  never finished) and ``Completed`` once every part was applied once. The current version is
  the newest ``Completed`` entry (the ``Version`` column of ``oc get clusterversion``).
* ``spec.desiredUpdate`` (``image``, ``version``, ``force``) is what an admin asked for;
  ``status.desired`` what the CVO is applying.

Nothing here raises on input: every odd or missing field becomes a ``Problem`` with a reason
code (``ClusterVersionInvalid``, or ``ReleaseVersionInvalid`` for a version that is not
semver), the field's path and a clipped message, and the rest of the object is still read.
A caller that acts on the view (retirement, the one-touch start) acts only when
``view.is_usable`` (no problem at all): nothing is guessed.

``parse_semver``, ``compare_versions`` and ``check_upgrade_path`` (re-exported from
``nodeagent.versions``, which the bundle importer uses too) order release versions by semver
2.0.0 precedence and say whether a release upgrades the cluster's version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from nodeagent.strict import clip, quoted
from nodeagent.versions import REASON_NOT_AN_UPGRADE as REASON_NOT_AN_UPGRADE
from nodeagent.versions import REASON_UNKNOWN as REASON_UNKNOWN
from nodeagent.versions import REASON_VERSION as REASON_VERSION
from nodeagent.versions import PathVerdict as PathVerdict
from nodeagent.versions import SemVer as SemVer
from nodeagent.versions import check_upgrade_path as check_upgrade_path
from nodeagent.versions import compare_versions as compare_versions
from nodeagent.versions import parse_semver as parse_semver

CLUSTER_VERSION_NAME: Final = "version"
"""The one ClusterVersion of a cluster."""
COMPLETED: Final = "Completed"
PARTIAL: Final = "Partial"
UPDATE_STATES: Final = frozenset({COMPLETED, PARTIAL})

REASON_INVALID: Final = "ClusterVersionInvalid"
"""A field of the ClusterVersion is missing where it is required, or of the wrong shape."""

MAX_HISTORY: Final = 1000
"""History entries read (the CVO keeps far fewer); more is a problem, the first ones kept."""
MAX_CONDITIONS: Final = 100
MAX_VERSION_CHARS: Final = 64
MAX_IMAGE_CHARS: Final = 1024
MAX_TEXT_CHARS: Final = 4096
MESSAGE_CHARS: Final = 200
"""Clip of an input value quoted in a problem's message."""

_DIGEST_SUFFIX: Final = re.compile(r"@(sha256:[a-f0-9]{64})\Z")
_TIME: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def image_digest(image: str) -> str:
    """``sha256:<hex>`` of an image named by digest; ``""`` for one named by tag."""
    match = _DIGEST_SUFFIX.search(image)
    return match.group(1) if match else ""


@dataclass(frozen=True, slots=True)
class Problem:
    reason: str
    field: str
    """Path of the field, e.g. ``status.history[2].state``."""
    message: str


@dataclass(frozen=True, slots=True)
class Release:
    """A release as ClusterVersion names it (``status.desired``, a history entry)."""

    version: str
    """As written (may be empty: the CVO leaves it empty when the image has none)."""
    image: str
    digest: str
    """``sha256:<hex>`` when ``image`` is named by digest, else ``""``."""

    @property
    def semver(self) -> SemVer | None:
        return parse_semver(self.version)


@dataclass(frozen=True, slots=True)
class DesiredUpdate:
    """``spec.desiredUpdate``: what an admin (or the one-touch start) asked for."""

    image: str
    version: str
    force: bool
    digest: str
    """``sha256:<hex>`` of ``image`` when named by digest, else ``""``."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    state: str
    """``Completed`` or ``Partial`` (anything else is a problem and the entry is dropped)."""
    release: Release
    started_time: datetime | None
    completion_time: datetime | None
    """None while the update runs (the newest entry) or when it never completed."""
    verified: bool

    @property
    def is_completed(self) -> bool:
        return self.state == COMPLETED


@dataclass(frozen=True, slots=True)
class VersionCondition:
    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str
    message: str
    last_transition_time: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterVersionView:
    name: str
    generation: int | None
    observed_generation: int | None
    channel: str
    desired_update: DesiredUpdate | None
    desired: Release | None
    """``status.desired``: the release the CVO applies (or last applied)."""
    history: tuple[HistoryEntry, ...]
    conditions: tuple[VersionCondition, ...]
    problems: tuple[Problem, ...] = field(default=())

    @property
    def is_usable(self) -> bool:
        """No problem at all: a caller may act on the view (retire, start an upgrade)."""
        return not self.problems

    @property
    def current(self) -> Release | None:
        """The newest ``Completed`` release: the cluster's version; None before the first."""
        for entry in self.history:
            if entry.is_completed:
                return entry.release
        return None

    @property
    def is_updating(self) -> bool:
        """The newest history entry is ``Partial``: an update runs (or stopped half-way)."""
        return bool(self.history) and not self.history[0].is_completed

    def condition(self, kind: str) -> VersionCondition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def is_condition_true(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.status == "True"

    def completed_digests(self) -> frozenset[str]:
        """Digests of every release the history says completed once."""
        return frozenset(
            e.release.digest for e in self.history if e.is_completed and e.release.digest
        )

    def target_digests(self) -> frozenset[str]:
        """Digests the cluster is asked to move to or is moving to: the desired update's, and
        ``status.desired``'s and a ``Partial`` newest entry's while not completed."""
        found = set()
        if self.desired_update is not None and self.desired_update.digest:
            found.add(self.desired_update.digest)
        current = self.current
        for release in (self.desired, self.history[0].release if self.is_updating else None):
            if (
                release is not None
                and release.digest
                and (current is None or release.digest != current.digest)
            ):
                found.add(release.digest)
        return frozenset(found)


class _Reader:
    """Collects problems while reading one object."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str, reason: str = REASON_INVALID) -> None:
        self.problems.append(Problem(reason, path, clip(message, MESSAGE_CHARS * 2)))

    def mapping(self, value: object, path: str, *, required: bool = False) -> Mapping[str, Any]:
        if isinstance(value, Mapping):
            return value
        if value is not None or required:
            self.problem(path, f"{path} is {_kind(value)}, not an object")
        return {}

    def text(self, value: object, path: str, limit: int, *, required: bool = False) -> str:
        if isinstance(value, str) and len(value) <= limit and value.isprintable():
            return value
        if value is None and not required:
            return ""
        if isinstance(value, str):
            self.problem(
                path, f"{path} {quoted(value, MESSAGE_CHARS)} is too long or not printable"
            )
        else:
            self.problem(path, f"{path} is {_kind(value)}, not a string")
        return ""

    def flag(self, value: object, path: str) -> bool:
        if isinstance(value, bool) or value is None:
            return bool(value)
        self.problem(path, f"{path} is {_kind(value)}, not true or false")
        return False

    def count(self, value: object, path: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
            return value
        self.problem(path, f"{path} is {quoted(value, 40)}, not a generation")
        return None

    def time(self, value: object, path: str, *, nullable: bool) -> datetime | None:
        if value is None:
            if not nullable:
                self.problem(path, f"{path} is missing")
            return None
        if isinstance(value, str) and len(value) <= 40 and _TIME.fullmatch(value):
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                parsed = None
            if parsed is not None:
                return parsed.astimezone(UTC)
        self.problem(path, f"{path} {quoted(value, 60)} is not an RFC 3339 time")
        return None

    def version(self, value: object, path: str) -> str:
        text = self.text(value, path, MAX_VERSION_CHARS)
        if text and parse_semver(text) is None:
            self.problem(
                path,
                f"{path} {quoted(text, MESSAGE_CHARS)} is not a semantic version such as 4.16.3",
                REASON_VERSION,
            )
        return text

    def items(self, value: object, path: str, limit: int) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(path, f"{path} is {_kind(value)}, not a list")
            return []
        if len(value) > limit:
            self.problem(path, f"{path} has {len(value)} entries; only the first {limit} are read")
        return value[:limit]


def _kind(value: object) -> str:
    if value is None:
        return "missing"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
    }.get(type(value), "an object" if isinstance(value, Mapping) else "of another type")


def _release(r: _Reader, value: object, path: str) -> Release | None:
    doc = r.mapping(value, path)
    if not isinstance(value, Mapping):
        return None
    version = r.version(doc.get("version"), f"{path}.version")
    image = r.text(doc.get("image"), f"{path}.image", MAX_IMAGE_CHARS)
    return Release(version, image, image_digest(image))


def _desired_update(r: _Reader, value: object) -> DesiredUpdate | None:
    path = "spec.desiredUpdate"
    doc = r.mapping(value, path)
    if not isinstance(value, Mapping):
        return None
    image = r.text(doc.get("image"), f"{path}.image", MAX_IMAGE_CHARS)
    version = r.version(doc.get("version"), f"{path}.version")
    force = r.flag(doc.get("force"), f"{path}.force")
    if not image and not version:
        r.problem(path, f"{path} names neither an image nor a version")
    return DesiredUpdate(image, version, force, image_digest(image))


def _history_entry(r: _Reader, value: object, path: str) -> HistoryEntry | None:
    doc = r.mapping(value, path, required=True)
    if not doc:
        return None
    state = r.text(doc.get("state"), f"{path}.state", 32, required=True)
    if state not in UPDATE_STATES:
        if state:
            r.problem(
                f"{path}.state",
                f"{path}.state {quoted(state, 40)} is neither Completed nor Partial",
            )
        return None
    release = _release(r, {"version": doc.get("version"), "image": doc.get("image")}, path)
    if release is None or not release.image:
        r.problem(f"{path}.image", f"{path}.image is missing")
        return None
    started = r.time(doc.get("startedTime"), f"{path}.startedTime", nullable=False)
    completed = r.time(doc.get("completionTime"), f"{path}.completionTime", nullable=True)
    verified = r.flag(doc.get("verified"), f"{path}.verified")
    return HistoryEntry(state, release, started, completed, verified)


def _condition(r: _Reader, value: object, path: str) -> VersionCondition | None:
    doc = r.mapping(value, path, required=True)
    kind = r.text(doc.get("type"), f"{path}.type", 316, required=True) if doc else ""
    if not kind:
        return None
    status = r.text(doc.get("status"), f"{path}.status", 16, required=True)
    if status not in ("True", "False", "Unknown"):
        r.problem(
            f"{path}.status", f"{path}.status {quoted(status, 20)} is not True, False or Unknown"
        )
    return VersionCondition(
        kind,
        status,
        r.text(doc.get("reason"), f"{path}.reason", 1024),
        r.text(doc.get("message"), f"{path}.message", 32768),
        r.time(doc.get("lastTransitionTime"), f"{path}.lastTransitionTime", nullable=True),
    )


def parse_cluster_version(obj: object) -> ClusterVersionView:
    """The view of a ClusterVersion object; never raises (problems are in ``view.problems``)."""
    r = _Reader()
    doc = r.mapping(obj, "ClusterVersion", required=True)
    metadata = r.mapping(doc.get("metadata"), "metadata", required=True)
    spec = r.mapping(doc.get("spec"), "spec", required=True)
    status = r.mapping(doc.get("status"), "status")
    name = r.text(metadata.get("name"), "metadata.name", 253, required=True)
    history = tuple(
        entry
        for index, item in enumerate(r.items(status.get("history"), "status.history", MAX_HISTORY))
        if (entry := _history_entry(r, item, f"status.history[{index}]")) is not None
    )
    conditions = tuple(
        condition
        for index, item in enumerate(
            r.items(status.get("conditions"), "status.conditions", MAX_CONDITIONS)
        )
        if (condition := _condition(r, item, f"status.conditions[{index}]")) is not None
    )
    return ClusterVersionView(
        name=name,
        generation=r.count(metadata.get("generation"), "metadata.generation"),
        observed_generation=r.count(status.get("observedGeneration"), "status.observedGeneration"),
        channel=r.text(spec.get("channel"), "spec.channel", MAX_TEXT_CHARS),
        desired_update=_desired_update(r, spec.get("desiredUpdate")),
        desired=_release(r, status.get("desired"), "status.desired"),
        history=history,
        conditions=conditions,
        problems=tuple(r.problems),
    )
