"""One sync's findings (``SyncPass``) and the statuses built from them.

A set is reported as one of three kinds:

* loaded: its spec file loaded; its state follows admission, pulls and pins;
* held: its file (or directory) has a problem now but the set was loaded from it before:
  it stands at its last good generation with the images it had pinned, reason
  ``SpecInvalid`` (only removing the file lets it go);
* unsized: loaded, but held back by disk admission because an image's size is unknown,
  reason ``SizeUnknown`` (its failures name why: the registry down, a 5xx …).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from nodeagent.disk import ImageLayers
from nodeagent.errors import NodeAgentError, SpecInvalid
from nodeagent.ledger import Ledger
from nodeagent.pins import PinCheck
from nodeagent.ports import StoredImage
from nodeagent.specs import PinnedImageSet, SpecLoad
from nodeagent.status import (
    DiskStatus,
    ImageFailure,
    SetState,
    SetStatus,
    interim_state,
    set_outcome,
    truncate_error,
)

log = structlog.get_logger(__name__)


def index_names(images: Iterable[StoredImage]) -> dict[str, StoredImage]:
    return {name.lower(): image for image in images for name in image.names()}


def set_refs(s: PinnedImageSet) -> list[str]:
    return [str(ref) for ref in s.images]


def now_text() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class SyncPass:
    """Everything one sync learns, threaded through its steps."""

    specs: SpecLoad
    ledger: Ledger
    generations: dict[str, int]
    released: set[str]
    held: dict[str, str] = field(default_factory=dict)
    """Sets whose file has a problem now, standing at their last good generation: name ->
    the file they were last loaded from."""
    runtime: str = ""
    stored: dict[str, StoredImage] = field(default_factory=dict)
    failures: dict[str, ImageFailure] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unsized: dict[str, str] = field(default_factory=dict)
    """Sets held by admission because an image's size is unknown, with why."""
    disk: DiskStatus | None = None
    pin_error: NodeAgentError | None = None
    check: PinCheck | None = None
    pending: dict[str, list[str]] = field(default_factory=dict)
    """Per set, the images missing when the sync started."""
    to_pull: dict[str, int] = field(default_factory=dict)
    """Per set, compressed bytes still to download (from the manifests)."""
    layers: dict[str, ImageLayers] = field(default_factory=dict)
    """Manifests of the images to pull, from admission."""
    stored_layers: set[str] = field(default_factory=set)
    """Layer digests of images the runtime already has."""

    def is_present(self, ref: str) -> bool:
        return ref.lower() in self.stored

    def bytes_present(self, refs: Iterable[str]) -> int:
        return sum(self.stored[r.lower()].size_bytes for r in refs if self.is_present(r))

    def problem_for(self, source: str) -> str:
        """The first spec problem of the file (or its directory) a held set came from."""
        for problem in self.specs.problems:
            where = problem.source.rstrip("/")
            if source == where or source.startswith(where + "/"):
                return problem.message
        return f"{source} is invalid"

    def problems_json(self) -> list[dict[str, str]]:
        return [
            {"file": p.source, "set": p.object_name or "", "reason": p.reason, "message": p.message}
            for p in self.specs.problems
        ]


# ---------------------------------------------------------------- interim
def interim_set(run: SyncPass, s: PinnedImageSet) -> SetStatus:
    """A loaded set's status while the sync's pulls run."""
    refs = set_refs(s)
    generation = run.generations[s.name]
    record = run.ledger.entry(s.name)
    pending = run.pending.get(s.name, [])
    state = interim_state(
        is_refused=s.name in run.refused,
        pending=pending,
        current_generation=record.current_generation,
        generation=generation,
        is_unsized=s.name in run.unsized,
    )
    failed_generation, failed_error = record.last_failed_generation, record.last_failed_error
    reason = None
    if state == "Refused":
        failed_generation, failed_error = generation, run.refused[s.name]
        reason = "InsufficientDiskSpace"
    elif s.name in run.unsized:
        failed_generation, failed_error = generation, run.unsized[s.name]
        reason = "SizeUnknown"
    return SetStatus(
        name=s.name,
        source=s.source,
        is_persistent=s.is_persistent,
        state=state,
        desired_generation=generation,
        current_generation=record.current_generation,
        last_failed_generation=failed_generation,
        last_failed_error=failed_error,
        images_total=len(refs),
        images_present=len(refs) - len(pending),
        images_pinned=len(refs) - len(pending) if state == "Pinned" else 0,
        failures=tuple(run.failures[r] for r in refs if r in run.failures),
        reason=reason,
        bytes_present=run.bytes_present(refs),
        bytes_to_pull=run.to_pull.get(s.name, 0),
        pending=tuple(pending),
    )


# ---------------------------------------------------------------- final
def final_set(run: SyncPass, s: PinnedImageSet) -> SetStatus:
    """A loaded set's status after the sync; records its outcome in the ledger."""
    refs = set_refs(s)
    generation = run.generations[s.name]
    present = [r for r in refs if run.is_present(r)]
    not_pinned = set(run.check.not_pinned) if run.check else set(refs)
    pinned = [r for r in present if r not in not_pinned]
    failures = tuple(run.failures[r] for r in refs if r in run.failures)
    pin_error = run.pin_error
    state, reason, error = set_outcome(
        refused_error=run.refused.get(s.name),
        failures=failures,
        pin_error=(pin_error.reason, pin_error.message) if pin_error else None,
        is_all_pinned=len(pinned) == len(refs),
        unsized_error=run.unsized.get(s.name),
    )
    if state == "Pinned":
        if run.ledger.entry(s.name).current_generation != generation:
            log.info("set_pinned", set=s.name, generation=generation, images=len(refs))
        run.ledger.record_pinned(s.name, generation, refs)
    elif error is not None:
        run.ledger.record_failed(s.name, generation, truncate_error(error))
        log.error("set_failed", set=s.name, generation=generation, reason=reason, error=error)
    record = run.ledger.entry(s.name)
    return SetStatus(
        name=s.name,
        source=s.source,
        is_persistent=s.is_persistent,
        state=state,
        desired_generation=generation,
        current_generation=record.current_generation,
        last_failed_generation=record.last_failed_generation,
        last_failed_error=record.last_failed_error,
        images_total=len(refs),
        images_present=len(present),
        images_pinned=len(pinned),
        failures=failures,
        reason=reason,
        bytes_present=run.bytes_present(refs),
        bytes_to_pull=0 if len(present) == len(refs) else run.to_pull.get(s.name, 0),
    )


def held_set(run: SyncPass, name: str, *, is_final: bool) -> SetStatus:
    """A set whose file is invalid now: its last good generation and the images it pinned."""
    record = run.ledger.entry(name)
    source = run.held[name]
    refs = sorted(record.pinned_images)
    present = [r for r in refs if run.is_present(r)]
    not_pinned = set(run.check.not_pinned) if run.check else set()
    pinned = [r for r in present if r not in not_pinned]
    is_standing = record.current_generation is not None and refs and len(pinned) == len(refs)
    state: SetState = "Pinned" if is_standing else "Degraded"
    message = (
        f"{run.problem_for(source)}; generation {record.current_generation} stays pinned "
        "until the file is fixed (remove the file to unpin the set)"
        if is_standing
        else f"{run.problem_for(source)}; the set keeps what it had pinned until the file is fixed"
    )
    if is_final:
        log.warning(
            "set_held",
            set=name,
            file=source,
            generation=record.current_generation,
            reason=SpecInvalid.reason,
            error=message,
        )
    return SetStatus(
        name=name,
        source=source,
        is_persistent=record.is_persistent,
        state=state,
        desired_generation=record.desired_generation,
        current_generation=record.current_generation,
        last_failed_generation=record.desired_generation,
        last_failed_error=truncate_error(message),
        images_total=len(refs),
        images_present=len(present),
        images_pinned=len(pinned),
        reason=SpecInvalid.reason,
        bytes_present=run.bytes_present(refs),
    )


def wanted_pins(run: SyncPass) -> set[str]:
    """Complete sets' images; for a set not complete (or held) what it had pinned.

    An image the set still lists and had pinned stays pinned while it is missing (lost
    with the runtime's storage, being brought back): the pins stay in place throughout.
    """
    wanted: set[str] = set()
    for s in run.specs.sets:
        refs = set_refs(s)
        if all(run.is_present(r) for r in refs):
            wanted.update(refs)
        else:  # keep what this set had pinned until its new generation is complete
            listed = set(refs)
            kept = run.ledger.pinned_of(s.name)
            wanted.update(r for r in kept if run.is_present(r) or r in listed)
    for name in run.held:
        wanted.update(r for r in run.ledger.pinned_of(name) if run.is_present(r))
    return wanted


def unsized_failures(run: SyncPass, refs: Sequence[str], unknown: dict[str, ImageFailure]) -> None:
    """Record why the images of a set held for an unknown size could not be sized."""
    for ref in refs:
        if ref in unknown:
            run.failures[ref] = unknown[ref]
