"""A bundle's freshness: its channel, sequence and expiry, and the anti-rollback rule (pure).

``bundle.json`` (format version 3, docs/bundle-format.md#anti-rollback) carries, signed:

- ``channel``: a release line of the signing key (``default`` when absent);
- ``sequence``: an integer from 0 to 2^53-1 (what every JSON reader holds exactly) that
  grows with each bundle of a key and channel (``bundle create``: the creation time in
  seconds unless ``--sequence`` says otherwise). A version 1 or 2 bundle has none: its
  sequence is its ``created`` time in whole seconds since 1970 (0 before 1970);
- ``expires``: optional, an RFC 3339 UTC time after which no node takes the bundle;
- ``supersedes``: optional, the ids of older signing keys this bundle's key replaces.

The rule (``judge``): a node refuses a bundle whose sequence is lower than the highest it
has accepted for the same key and channel (``BundleRollback``), or equal to it with another
manifest (two bundles that claim one place in the line: which one is newer cannot be told),
or whose ``expires`` is past (``BundleExpired``). The same manifest again is the same bundle
(a re-import changes nothing). Channels do not block each other: a release line and an
application line signed by one key each have their own high-water mark.

Two amendments (docs/decisions/0040-anti-rollback.md, issue 24 finding 11):

- **No format downgrade.** Once a bundle of format N was accepted from a key, a bundle of
  an older format from that key is refused (``BundleFormatDowngrade``): a format 1 or 2
  bundle's only order is its creation second, which says nothing about the key's line
  since it moved to signed sequences.
- **Keys linked by ``supersedes`` share their marks.** A key's marks are its own unless an
  accepted bundle (or the candidate itself) declares that its key supersedes another: then
  both keys, and every key linked to them so, form one *lineage* whose marks (per channel)
  and highest format count for a bundle of any of them. So the new key's first bundle must
  be newer than the old key's newest, and after it an old key that is still trusted cannot
  take the node back below the new key's mark. Without the declaration keys stay apart.

What a node has accepted is read from the signed manifests its store keeps
(``adapters.store.accepted``), never from a state file a rebuild could reset.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION
from nodeagent.errors import (
    BundleExpired,
    BundleFormatDowngrade,
    BundleManifestInvalid,
    BundleRollback,
)
from nodeagent.strict import clip, quoted

DEFAULT_CHANNEL: Final = "default"
"""The channel of a bundle whose ``bundle.json`` names none."""
MAX_SEQUENCE: Final = (1 << 53) - 1
"""The largest integer a JSON reader that uses doubles still holds exactly."""
_CHANNEL = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
TIME_FORM = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")
"""``created`` and ``expires``: RFC 3339, UTC, ``Z``; at most nanoseconds."""
_DURATION = re.compile(r"^([1-9][0-9]{0,5})([dhm])$")
_UNIT_S: Final = {"d": 86400, "h": 3600, "m": 60}
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


MAX_SUPERSEDED: Final = 8
"""Key ids one bundle may declare superseded: a rotation names one, rarely two."""
_KEY_ID = re.compile(r"^(0|[1-9A-F][0-9A-F]{0,15})$")
"""A minisign key id as ``key_id_hex`` writes it: upper-case hex without leading zeros."""


@dataclass(frozen=True, slots=True)
class Freshness:
    """A manifest's freshness fields, as read from ``bundle.json``."""

    channel: str
    sequence: int
    expires: str | None
    supersedes: tuple[str, ...] = ()
    """Key ids the signing key replaces (format 3; sorted, each once)."""


def is_key_id(text: object) -> bool:
    """A minisign key id as ``key_id_hex`` writes it."""
    return isinstance(text, str) and _KEY_ID.match(text) is not None


def with_links(
    supersedes: tuple[str, ...], key_id: str, linked: tuple[str, ...]
) -> tuple[str, ...]:
    """A stamp's ``supersedes`` with ``linked``: the other key that signed the same manifest
    (a bundle signed with minisign and ECDSA, decision 0075). ``lineage`` follows the links
    both ways, so both keys' marks hold for the bundle, and an older bundle stripped of one
    signature is still judged against the other key's mark."""
    if not linked:
        return supersedes
    return tuple(sorted({*supersedes, *linked} - {key_id}))


def supersedes_of(value: object, *, limit: int = MAX_SUPERSEDED) -> tuple[str, ...]:
    """``supersedes``: a list of 1 to 8 distinct key ids (upper-case hex, as minisign and
    ``nodeagent bundle verify`` show them). ``limit``: a stamp's may hold one more, the
    other key of a bundle signed with both schemes (``ecdsa_signature.linked_stamp``)."""
    if not isinstance(value, list) or not 1 <= len(value) <= limit:
        raise BundleManifestInvalid(
            f"bundle.json: supersedes must be a list of 1 to {limit} key ids"
        )
    for item in value:
        if not is_key_id(item):
            raise BundleManifestInvalid(
                f"bundle.json: supersedes holds {quoted(item, 40)}, not a key id (upper-case "
                "hex without leading zeros, as `nodeagent bundle verify` shows it)"
            )
    if len(set(value)) != len(value):
        raise BundleManifestInvalid("bundle.json: supersedes names a key twice")
    return tuple(sorted(value))


def parse_time(text: str, what: str) -> dt.datetime:
    """A strict RFC 3339 UTC time (``…T…Z``) that names a real instant."""
    if not TIME_FORM.match(text):
        raise BundleManifestInvalid(
            f"bundle.json: {what} {quoted(text, 60)} must be an RFC 3339 UTC time (…T…Z)"
        )
    whole, _, fraction = text.removesuffix("Z").partition(".")
    try:
        when = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC)
    except ValueError:
        raise BundleManifestInvalid(
            f"bundle.json: {what} {quoted(text, 60)} is no real time"
        ) from None
    return when + dt.timedelta(microseconds=int(fraction[:6].ljust(6, "0")) if fraction else 0)


def sequence_of_created(created: str) -> int:
    """A version 1 or 2 bundle's sequence: ``created`` in whole seconds since 1970, at least 0."""
    when = parse_time(created, "created")
    return max(0, int((when - _EPOCH).total_seconds() // 1))


def freshness_of(doc: Mapping[str, Any], created: str) -> Freshness:
    """The freshness fields of ``bundle.json`` (its ``formatVersion`` already known)."""
    channel = doc.get("channel", DEFAULT_CHANNEL)
    if not isinstance(channel, str) or not _CHANNEL.match(channel):
        raise BundleManifestInvalid(
            f"bundle.json: channel {quoted(channel, 100)} must be 1-64 of A-Z a-z 0-9 . _ -"
        )
    if doc.get("formatVersion") != FRESHNESS_FORMAT_VERSION:
        present = sorted({"sequence", "expires", "supersedes"} & set(doc))
        if present:
            raise BundleManifestInvalid(
                f"bundle.json: {present[0]} needs formatVersion {FRESHNESS_FORMAT_VERSION} (a "
                "nodeagent that reads only older versions would ignore it)"
            )
        return Freshness(channel, sequence_of_created(created), None)
    sequence = doc.get("sequence")
    if type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE:
        raise BundleManifestInvalid(
            f"bundle.json: sequence must be an integer from 0 to {MAX_SEQUENCE}, not "
            f"{clip(sequence, 40)}"
        )
    expires = doc.get("expires")
    if expires is not None:
        if not isinstance(expires, str):
            raise BundleManifestInvalid("bundle.json: expires must be a string (RFC 3339 UTC)")
        parse_time(expires, "expires")
    supersedes = supersedes_of(doc["supersedes"]) if "supersedes" in doc else ()
    return Freshness(channel, sequence, expires, supersedes)


# ---------------------------------------------------------------- the rule
@dataclass(frozen=True, slots=True)
class Stamp:
    """One signed manifest as the rule sees it: who signed it, its line and its place."""

    key_id: str
    """The signing key's id (minisign's upper-case hex)."""
    channel: str
    sequence: int
    manifest_digest: str
    """``sha256:<hex>`` of the ``bundle.json`` bytes."""
    bundle_id: str
    format_version: int = FRESHNESS_FORMAT_VERSION
    """``formatVersion`` of the manifest (every stamp the node builds names it)."""
    supersedes: tuple[str, ...] = ()
    """Key ids the manifest declares its key replaces (``supersedes``)."""


Verdict = Literal["fresh", "same", "rollback", "reused", "downgrade"]


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    mark: Stamp | None = None
    """The high-water mark of the bundle's key and channel (None: nothing accepted yet)."""

    @property
    def is_taken(self) -> bool:
        return self.verdict in ("fresh", "same")


def lineage(key_id: str, accepted: Iterable[Stamp], declared: Iterable[str] = ()) -> frozenset[str]:
    """``key_id`` and every key linked to it by a ``supersedes`` declaration of an accepted
    stamp, or ``declared`` by the candidate, in either direction and transitively."""
    links: dict[str, set[str]] = {}
    pairs = [(s.key_id, old) for s in accepted for old in s.supersedes]
    for new, old in [*pairs, *((key_id, old) for old in declared)]:
        links.setdefault(new, set()).add(old)
        links.setdefault(old, set()).add(new)
    found, todo = {key_id}, [key_id]
    while todo:
        for other in links.get(todo.pop(), ()):
            if other not in found:
                found.add(other)
                todo.append(other)
    return frozenset(found)


def high_water(
    accepted: Iterable[Stamp], key_id: str | frozenset[str], channel: str
) -> Stamp | None:
    """The accepted bundle of ``key_id`` (or any key of a lineage) and ``channel`` with the
    highest sequence (ties: the smallest digest, so the answer does not depend on the order
    read)."""
    keys = frozenset({key_id}) if isinstance(key_id, str) else key_id
    line = [s for s in accepted if s.key_id in keys and s.channel == channel]
    return max(line, key=lambda s: (s.sequence, _reverse(s.manifest_digest)), default=None)


def format_mark(accepted: Iterable[Stamp], keys: frozenset[str]) -> Stamp | None:
    """The accepted bundle of the lineage ``keys`` with the highest format (ties: the highest
    sequence, then the smallest digest)."""
    signed = [s for s in accepted if s.key_id in keys]
    order = lambda s: (s.format_version, s.sequence, _reverse(s.manifest_digest))  # noqa: E731
    return max(signed, key=order, default=None)


def _reverse(digest: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in digest)


def is_expired(expires: str | None, now: dt.datetime) -> bool:
    """Whether ``expires`` (None: never) is past: at that very instant the bundle is expired."""
    return expires is not None and now >= parse_time(expires, "expires")


def judge(candidate: Stamp, accepted: Iterable[Stamp]) -> Judgement:
    """Whether this node takes ``candidate`` given what it accepted before (the format and
    sequence rules over the candidate's lineage; the expiry is ``is_expired``'s). A manifest
    accepted before that still holds its channel's mark is the same bundle, whatever its
    format."""
    accepted = tuple(accepted)
    keys = lineage(candidate.key_id, accepted, candidate.supersedes)
    mark = high_water(accepted, keys, candidate.channel)
    judgement = _by_sequence(candidate, accepted, keys, mark)
    if judgement.verdict == "same":
        return judgement
    top = format_mark(accepted, keys)
    if top is not None and candidate.format_version < top.format_version:
        return Judgement("downgrade", top)
    return judgement


def _by_sequence(
    candidate: Stamp, accepted: tuple[Stamp, ...], keys: frozenset[str], mark: Stamp | None
) -> Judgement:
    if mark is None or candidate.sequence > mark.sequence:
        return Judgement("fresh", mark)
    if candidate.sequence < mark.sequence:
        return Judgement("rollback", mark)
    same = any(
        s.manifest_digest == candidate.manifest_digest
        for s in accepted
        if s.key_id in keys and (s.channel, s.sequence) == (candidate.channel, mark.sequence)
    )
    return Judgement("same" if same else "reused", mark)


def lowered_marks(candidate: Stamp, accepted: Iterable[Stamp]) -> tuple[Stamp, ...]:
    """The high-water marks that storing ``candidate`` would lower: the store keeps one signed
    manifest per bundle id, so a bundle replaces the manifest stored under its id. Never
    allowed, not even by hand: the marks only go up."""
    accepted = tuple(accepted)
    after = [s for s in accepted if s.bundle_id != candidate.bundle_id] + [candidate]
    lost = []
    for key_id, channel in sorted({(s.key_id, s.channel) for s in accepted}):
        mark, kept = high_water(accepted, key_id, channel), high_water(after, key_id, channel)
        if mark is not None and (kept is None or kept.sequence < mark.sequence):
            lost.append(mark)
    return tuple(lost)


def replacing_error(candidate: Stamp, mark: Stamp) -> BundleRollback:
    return BundleRollback(
        f"bundle {clip(candidate.bundle_id, 128)} would replace the signed manifest stored "
        f"under its id, which holds the high-water mark of key {mark.key_id} channel "
        f"{clip(mark.channel, 64)} (sequence {mark.sequence}); a bundle's id must be its "
        "own: make it again with another id (`bundle create --id`)"
    )


def expired_error(bundle_id: str, expires: str | None, now: dt.datetime) -> BundleExpired:
    """Why a bundle past its ``expires`` is refused: both times, the node's clock being the
    judge (a clock stepped forward refuses a bundle that is still valid)."""
    clock = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return BundleExpired(
        f"bundle {clip(bundle_id, 128)} expired at {clip(expires, 40)}; this node's clock says "
        f"{clock}. Use a newer bundle, check the node's clock if the bundle should still be "
        "valid, or import it by hand with `nodeagent bundle import --allow-expired` if it "
        "must be taken anyway"
    )


def downgrade_error(candidate: Stamp, mark: Stamp) -> BundleFormatDowngrade:
    """Why ``candidate``, of an older format than ``mark``, is refused; what to do."""
    return BundleFormatDowngrade(
        f"bundle {clip(candidate.bundle_id, 128)} is format {candidate.format_version}, older "
        f"than bundle {clip(mark.bundle_id, 128)} (format {mark.format_version}) accepted "
        f"before from key {mark.key_id}{_linked(candidate, mark)}: once a key signs a newer "
        "format, its older-format bundles (ordered only by their creation time) are not taken. "
        "Use the newest bundle of that key; to go back on purpose, import it by hand with "
        "`nodeagent bundle import --allow-rollback`"
    )


def _linked(candidate: Stamp, mark: Stamp) -> str:
    if mark.key_id == candidate.key_id:
        return ""
    return f" (linked by supersedes to key {candidate.key_id}, which signed this one)"


def rollback_error(candidate: Stamp, mark: Stamp) -> BundleRollback:
    """Why ``candidate`` is refused, its high-water mark being ``mark``; what to do."""
    held = f"bundle {clip(mark.bundle_id, 128)} (sequence {mark.sequence})"
    line = f"key {mark.key_id} channel {clip(candidate.channel, 64)}{_linked(candidate, mark)}"
    if candidate.sequence == mark.sequence:
        why = f"has sequence {candidate.sequence} with another manifest than {held} of {line}"
    else:
        why = f"has sequence {candidate.sequence}, lower than {held} of {line}"
    return BundleRollback(
        f"bundle {clip(candidate.bundle_id, 128)} {why}, accepted before: an older bundle is "
        "never taken after a newer one. Use the newest bundle of the channel; to go back on "
        "purpose, import it by hand with `nodeagent bundle import --allow-rollback`"
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """``check``'s answer: the refusal, else what a technician's flag set aside (to log)."""

    refusal: BundleRollback | BundleExpired | None = None
    is_expiry_ignored: bool = False
    passed_mark: Stamp | None = None
    """With ``--allow-rollback``: the high-water mark the bundle is not newer than."""


def check(
    candidate: Stamp,
    expires: str | None,
    accepted: Iterable[Stamp],
    now: dt.datetime | None,
    *,
    is_allowing_rollback: bool = False,
    is_allowing_expired: bool = False,
) -> Checked:
    """Expiry (by ``now``; None: not checked), then whether storing the bundle would lower a
    mark (never allowed), then the sequence rule."""
    is_past = now is not None and is_expired(expires, now)
    if now is not None and is_past and not is_allowing_expired:
        return Checked(expired_error(candidate.bundle_id, expires, now))
    accepted = tuple(accepted)
    lowered = lowered_marks(candidate, accepted)
    if lowered:
        return Checked(replacing_error(candidate, lowered[0]), is_past)
    judgement = judge(candidate, accepted)
    if judgement.is_taken or judgement.mark is None:
        return Checked(None, is_past)
    if not is_allowing_rollback:
        error = downgrade_error if judgement.verdict == "downgrade" else rollback_error
        return Checked(error(candidate, judgement.mark), is_past)
    return Checked(None, is_past, judgement.mark)


# ---------------------------------------------------------------- bundle create
def expiry_from_option(text: str, now: dt.datetime) -> str:
    """``--expires``: an RFC 3339 UTC time, or a duration from ``now`` (``30d``, ``12h``,
    ``90m``); the time ``bundle.json`` carries, in whole seconds."""
    found = _DURATION.match(text)
    if found is not None:
        when = now + dt.timedelta(seconds=int(found[1]) * _UNIT_S[found[2]])
        return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        parse_time(text, "--expires")
    except BundleManifestInvalid:
        raise ValueError(
            f"{clip(text, 60)!r} is neither an RFC 3339 UTC time (2027-01-31T00:00:00Z) nor a "
            "duration (30d, 12h, 90m)"
        ) from None
    return text
