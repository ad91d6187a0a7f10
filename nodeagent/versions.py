"""Release versions (pure): semver 2.0.0 order, and whether a release upgrades a version.

Used by the cluster's view of ClusterVersion (``cluster.clusterversion`` re-exports every
name), by the bundle importer (a release bundle that does not upgrade the cluster's version
is reported ``ReleaseNotAnUpgrade``) and by ``bundle create --release … --from-version``.
Nothing here raises on input: a version that is not semver is ``None`` or a verdict with
reason ``ReleaseVersionInvalid``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from nodeagent.strict import quoted

MAX_VERSION_CHARS: Final = 64

REASON_VERSION: Final = "ReleaseVersionInvalid"
"""A version is not semver (``4.16.3``, ``4.17.0-rc.1``)."""

_SEMVER: Final = re.compile(
    r"^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True, slots=True, order=False)
class SemVer:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = ""

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        return text + (f"+{self.build}" if self.build else "")

    @property
    def minor_line(self) -> str:
        """``4.16`` of ``4.16.3``."""
        return f"{self.major}.{self.minor}"


def parse_semver(text: object) -> SemVer | None:
    """The semver in ``text`` (at most 64 characters), or None when it is not one."""
    if not isinstance(text, str) or len(text) > MAX_VERSION_CHARS:
        return None
    match = _SEMVER.fullmatch(text)
    if match is None:
        return None
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    if any(part.isdigit() and len(part) > 1 and part.startswith("0") for part in pre):
        return None  # numeric identifiers have no leading zeroes
    major, minor, patch = (int(match.group(i)) for i in (1, 2, 3))
    return SemVer(major, minor, patch, pre, match.group(5) or "")


def _pre_key(part: str) -> tuple[int, int, str]:
    return (0, int(part), "") if part.isdigit() else (1, 0, part)


def compare_versions(a: SemVer, b: SemVer) -> int:
    """-1, 0 or 1 by semver precedence (build metadata is ignored)."""
    left, right = (a.major, a.minor, a.patch), (b.major, b.minor, b.patch)
    if left != right:
        return -1 if left < right else 1
    if a.prerelease == b.prerelease:
        return 0
    if not a.prerelease or not b.prerelease:
        return 1 if not a.prerelease else -1  # a release ranks above its pre-releases
    keys_a = [_pre_key(p) for p in a.prerelease]
    keys_b = [_pre_key(p) for p in b.prerelease]
    return -1 if keys_a < keys_b else 1


REASON_NOT_AN_UPGRADE: Final = "ReleaseNotAnUpgrade"
"""The release does not list the cluster's current version in ``previous``, or is older."""
REASON_UNKNOWN: Final = "ClusterVersionUnknown"
"""No ``Completed`` release in the history yet (or the object is unusable): nothing judged."""


@dataclass(frozen=True, slots=True)
class PathVerdict:
    """Whether a release is an upgrade of the cluster's current version (``check_upgrade_path``)."""

    reason: str
    """``""`` when it is an upgrade or the current release itself; else a reason code."""
    message: str
    current: str
    release: str

    @property
    def is_upgrade(self) -> bool:
        """The release may be proposed as the cluster's next version."""
        return not self.reason and self.current != self.release


def check_upgrade_path(current: str, release: str, previous: tuple[str, ...]) -> PathVerdict:
    """Is ``release`` (whose release-metadata lists ``previous``) an upgrade of ``current``?

    The release itself (already the cluster's) passes without being an upgrade; an older one
    is never an upgrade, whatever ``previous`` says (a downgrade is never proposed)."""
    now, then = parse_semver(current), parse_semver(release)
    if not current:
        return PathVerdict(
            REASON_UNKNOWN, "the cluster's current version is not known", "", release
        )
    if now is None or then is None:
        bad = current if now is None else release
        return PathVerdict(
            REASON_VERSION, f"version {quoted(bad, 80)} is not a semantic version", current, release
        )
    order = compare_versions(then, now)
    if order == 0:
        return PathVerdict(
            "", f"release {release} is the cluster's current version", current, release
        )
    if order < 0:
        return PathVerdict(
            REASON_NOT_AN_UPGRADE,
            f"release {release} is older than the cluster's version {current}: "
            "a downgrade is never proposed",
            current,
            release,
        )
    if current not in previous:
        return PathVerdict(
            REASON_NOT_AN_UPGRADE,
            f"release {release} does not upgrade from the cluster's version {current}: its "
            f"release-metadata lists {len(previous)} versions it upgrades from, not this one",
            current,
            release,
        )
    return PathVerdict("", f"release {release} upgrades from {current}", current, release)
