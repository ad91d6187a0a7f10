"""``nodeagent status``: the status file the daemon writes, for a person or a script.

Three renderings of the same file: ``--json`` (the file, with its ``schema``), a compact
table when stdout is a terminal (``print_table``), plain lines in a pipe (``print_status``:
one fact per line, grep-friendly). Both texts show the work in flight with its bytes, rate
and time left (``work_items``), and each bundle's last outcome. Every text from the file
passes ``strict.clip`` (set names, image references and bundle ids come from outside).
A time left is shown only when the total and a rate are known: it is never guessed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.strict import clip
from nodeagent.units import format_bytes

_CELL_CHARS = 48
_LAST_CELL_CHARS = 200
_LINE_CHARS = 2000
IN_FLIGHT_STATES = ("detected", "fetching", "storing", "importing")
"""Bundle states whose work is in flight (``status.BundleState``)."""
OUTCOMES = {
    "verified": "verified",
    "admitted": "verified",
    "stored": "verified, stored",
    "imported": "imported",
    "pinned": "imported, pinned",
    "rejected": "refused",
    "interrupted": "interrupted",
}
"""A bundle's last outcome, by its state (in-flight states: ``in progress``)."""
_STEPS = {
    "detected": "verifying",
    "fetching": "fetching from peers",
    "storing": "copying to the image store",
    "importing": "importing into the runtime",
}


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    if getattr(args, "watch", False) and not args.json:
        return watch(config)
    doc = JsonStateStore(config.state.dir).load("status")  # StateFileDamaged: exit 74
    if doc is None:
        where = config.state.dir / "status.json"
        output.print_error("StatusMissing", f"no status yet in {where}: nodeagent has not "
                           "finished a sync")  # fmt: skip
        return 1
    if args.json:
        output.print_json("status", doc)
        return 0
    render(config, doc, is_terminal=sys.stdout.isatty())
    return 0


def render(config: Config, doc: dict[str, Any], *, is_terminal: bool) -> None:
    """The verdict line, then the table (a terminal) or the plain lines (a pipe)."""
    try:
        _say(verdict(doc, daemon_alive(config)))
        (print_table if is_terminal else print_status)(doc)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise StateFileDamaged(
            f"the status file {config.state.dir / 'status.json'} has an unexpected shape "
            f"({clip(exc, 80)}); the daemon sets it aside and writes it anew at its next sync"
        ) from exc


def daemon_alive(config: Config) -> bool | None:
    """Whether the daemon runs: it holds the pin lock for its whole life (decision 0044), so
    a lock this command can take means none runs. None: the lock could not be looked at."""
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    try:
        if lock.try_acquire():
            lock.release()
            return False
    except HostFileError:
        return None
    return True


def verdict(doc: dict[str, Any], alive: bool | None) -> str:
    """One line first: all pinned / working: what, how much left / needs you: what to do;
    and whether the file is current (a stopped daemon's last "importing" is stale)."""
    updated = doc.get("updatedAt", "?")
    if alive is False:
        return (
            f"STALE: the daemon is not running; this status was written at {updated} and "
            "may no longer be true; what to do: systemctl start nodeagent, then look again"
        )
    conditions = {c["type"]: c for c in doc.get("conditions", [])}
    degraded = conditions.get("Degraded", {})
    failed = [i for s in doc.get("pinnedImageSets", []) for i in s.get("failedImages", [])]
    if degraded.get("status") == "True" or failed or doc.get("specProblems"):
        reason = degraded.get("reason") or (failed[0]["reason"] if failed else "SpecInvalid")
        message = degraded.get("message") or (
            failed[0]["message"] if failed else doc["specProblems"][0]["message"]
        )
        return f"NEEDS YOU: {reason}: {message}; what to do: {output.hint_for(reason)}"
    work = work_items(doc)
    if work or conditions.get("Progressing", {}).get("status") == "True":
        doing = "; ".join(
            f"{w.what} {w.done_text()} of {w.total_text()}, {w.eta_text()} left" for w in work[:3]
        )
        doing = doing or conditions["Progressing"].get("message", "")
        return f"WORKING: {doing}"
    images = doc.get("images", {})
    unsure = " (the daemon could not be checked)" if alive is None else ""
    return (
        f"ALL PINNED: {images.get('pinned', 0)}/{images.get('total', 0)} images in "
        f"{len(doc.get('pinnedImageSets', []))} set(s), as of {updated}{unsure}"
    )


WATCH_EVERY_S = 1.0
"""``status --watch``: how often the status file is read again."""


def watch(config: Config, *, rounds: int | None = None) -> int:
    """Read the status file every second until interrupted: on a terminal the view is drawn
    again in place; in a pipe a block is printed each time it changed (``rounds``: stop
    after that many reads, for tests)."""
    store = JsonStateStore(config.state.dir)
    is_terminal = sys.stdout.isatty()
    shown: dict[str, Any] | None = None
    done = 0
    try:
        while rounds is None or done < rounds:
            doc = store.load("status")
            if doc is not None and doc != shown:
                if is_terminal:
                    sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: drawn again in place
                else:
                    _say(f"---- {doc.get('updatedAt', '?')}")
                render(config, doc, is_terminal=is_terminal)
                sys.stdout.flush()
                shown = doc
            done += 1
            if rounds is None or done < rounds:
                time.sleep(WATCH_EVERY_S)
    except KeyboardInterrupt:
        return 0
    return 0


# ---------------------------------------------------------------- work in flight
@dataclass(frozen=True, slots=True)
class Work:
    """One job in flight: bytes done of a total, its rate and time left when known."""

    what: str
    done_bytes: int | None
    total_bytes: int | None
    rate_bytes_per_s: float | None
    eta_s: float | None
    note: str = ""
    done_count: str = ""
    """What is known done when bytes are not (pulls: ``1/3 images``)."""

    def done_text(self) -> str:
        if self.done_bytes is None:
            return self.done_count or "?"
        done = format_bytes(self.done_bytes)
        return f"{done} ({self.done_count})" if self.done_count else done

    def total_text(self) -> str:
        return "?" if self.total_bytes is None else format_bytes(self.total_bytes)

    def rate_text(self) -> str:
        rate = self.rate_bytes_per_s
        return "unknown" if rate is None else f"{rate / 1e6:.1f} MB/s"

    def eta_text(self) -> str:
        return "unknown" if self.eta_s is None else _duration(self.eta_s)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _whole(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def eta_of(done: int | None, total: int | None, rate: float | None) -> float | None:
    """Seconds left: only with a known total, bytes done and a rate above zero."""
    if done is None or not total or rate is None or rate <= 0:
        return None
    return max(0, total - done) / rate


def work_items(doc: dict[str, Any]) -> list[Work]:
    """Bundles being verified, fetched, copied or imported, and the sync's pulls."""
    items = [_bundle_work(b) for b in doc.get("bundles", []) if b.get("state") in IN_FLIGHT_STATES]
    pulls = doc.get("pulls")
    if pulls:
        items.append(_pull_work(pulls))
    return items


def _bundle_work(bundle: dict[str, Any]) -> Work:
    progress = bundle.get("progress") or {}
    done, total = _whole(progress.get("doneBytes")), _whole(progress.get("totalBytes"))
    rate = _number(progress.get("bytesPerSecond"))
    name = clip(bundle.get("bundleId") or bundle.get("source"), 100)
    return Work(
        f"bundle {name}: {_STEPS[bundle['state']]}",
        done, total or None, rate, eta_of(done, total, rate),
    )  # fmt: skip


def _pull_work(pulls: dict[str, Any]) -> Work:
    """The runtime reports no bytes while an image pulls: bytes count whole images (each
    image's blobs once it is pulled), the rate is over the time since the pulls started."""
    images = pulls.get("images") or {}
    counted = pulls.get("bytes") or {}
    total, done = _whole(counted.get("total")), _whole(counted.get("done"))
    rate = _number(pulls.get("bytesPerSecond"))
    note = (
        f"{images.get('done', 0)} of {images.get('total', 0)} images, "
        f"{images.get('inProgress', 0)} pulling, {images.get('failed', 0)} failed, "
        f"since {clip(pulls.get('startedAt', '?'), 40)}"
    )
    count = f"{images.get('done', 0)}/{images.get('total', 0)} images"
    return Work("pulls", done, total or None, rate, eta_of(done, total, rate), note, count)


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def bundle_outcome(bundle: dict[str, Any]) -> str:
    """``refused: BundleSignatureInvalid: …`` / ``imported, pinned`` / ``in progress``."""
    outcome = OUTCOMES.get(bundle.get("state", ""), "in progress")
    if bundle.get("reason"):
        outcome += f": {bundle['reason']}: {bundle.get('message', '')}"
    return outcome


# ---------------------------------------------------------------- plain lines
def _say(text: str) -> None:
    """One line of the status file: escape sequences escaped, clipped."""
    sys.stdout.write(clip(text, _LINE_CHARS) + "\n")


_MIRROR_STATES = {
    "serving": "serving on {listen}",
    "ready": "ready on {listen}, starts on the first request",
    "failed": "failed: nothing holds {listen} (systemctl status nodeagent-mirror.socket)",
    "unknown": "state unknown, not serving as far as reported",
}


def _mirror_text(mirror: dict[str, Any]) -> str:
    named = str(mirror.get("state") or ("serving" if mirror.get("serving") else "unknown"))
    state = _MIRROR_STATES.get(named, _MIRROR_STATES["unknown"]).format(
        listen=mirror.get("listen", "?")
    )
    text = (
        f"node mirror: {state}, {mirror.get('blobs', 0)} bundle blobs, "
        f"{mirror.get('registryBlobs', 0)} registry-set blobs; {mirror.get('requests', 0)} "
        f"requests, {mirror.get('bytesServed', 0)} bytes served, {mirror.get('missing', 0)} "
        f"asked for and not held, {mirror.get('denied', 0)} refused without the credential"
    )
    missing = mirror.get("recentMissing") or []
    return text + (f" (last missing: {missing[0]})" if missing else "")


def print_status(doc: dict[str, Any]) -> None:
    """Plain lines, one fact each (a pipe, a script's grep)."""
    images = doc.get("images", {})
    _say(f"updated: {doc.get('updatedAt', '?')}   runtime: {doc.get('runtime', '?')}")
    if doc.get("osImage"):
        _say(_os_text(doc["osImage"]))
    for cond in doc.get("conditions", []):
        _say(f"{cond['type']:<12} {cond['status']:<6} {cond['reason']}: {cond['message']}")
    _say(
        f"images: {images.get('pinned', 0)}/{images.get('total', 0)} pinned, "
        f"{images.get('failed', 0)} failed"
    )
    disk = doc.get("disk")
    if disk:
        _say(_disk_text(disk))
    if doc.get("nodeMirror"):
        _say(_mirror_text(doc["nodeMirror"]))
    for s in doc.get("pinnedImageSets", []):
        _print_set(s)
    for work in work_items(doc):
        _say(
            f"in flight: {work.what}: {work.done_text()} of {work.total_text()}, "
            f"rate {work.rate_text()}, time left {work.eta_text()}"
            + (f" ({work.note})" if work.note else "")
        )
    _print_notes(doc)
    if doc.get("retryInSeconds") is not None:
        _say(f"retrying in {doc['retryInSeconds']} s (transient failure)")
    if doc.get("lastError"):
        _say(f"last error: {doc['lastError']}")


def _disk_text(disk: dict[str, Any]) -> str:
    return (
        f"disk: {format_bytes(disk['availableBytes'])} available on {disk['mountpoint']}, "
        f"{format_bytes(disk['neededBytes'])} needed, "
        f"{format_bytes(disk['reserveBytes'])} kept free"
    )


def _print_notes(doc: dict[str, Any]) -> None:
    """Spec problems, rebuilt state, bundles, and pinned images the runtime lost."""
    for problem in doc.get("specProblems", []):
        message = problem["message"]
        where = "" if problem["file"] in message else f"{problem['file']}: "
        _say(f"invalid spec ({problem['set'] or '-'}): {problem['reason']}: {where}{message}")
    for repair in doc.get("stateRepairs", []):
        kept = f" (kept as {repair['movedTo']})" if repair.get("movedTo") else ""
        _say(f"state rebuilt: {repair['file']}: {repair['reason']}: {repair['message']}{kept}")
    for bundle in doc.get("bundles", []):
        _say(f"bundle {_bundle_name(bundle)} outcome: {bundle_outcome(bundle)}")
        _say(_bundle_text(bundle))
        for step in bundle.get("nextSteps", []):
            _say(f"  next: {step}")
        for warning in bundle.get("warnings", []):
            _say(f"  warning {warning.get('reason')}: {warning.get('message', '')}")
        for tag, digest in (bundle.get("frozenTags") or {}).items():
            _say(
                f"  frozen tag {tag} -> {digest} (served as signed, even if the registry moves it)"
            )
    loss = doc.get("imageLoss")
    if loss:
        _say(f"images lost at {loss['at']}: {loss['reason']}: {loss['message']}")
        if loss.get("restoredFromStore"):
            _say(f"restored {loss['restoredFromStore']} images from the local store")


def _os_text(image: dict[str, Any]) -> str:
    """'os: rhcos 4.18 (418.94…), booted quay.io/…@sha256:… (rpm-ostree)'."""
    version_id, version = str(image.get("versionId", "?")), str(image.get("version") or "")
    if version.startswith(version_id):  # Debian's "12 (bookworm)": not "12 (12 (bookworm))"
        text = f"os: {image.get('id', '?')} {version}"
    else:
        text = f"os: {image.get('id', '?')} {version_id}" + (f" ({version})" if version else "")
    booted = image.get("booted") or {}
    if booted:
        text += f", booted {booted.get('image')} ({booted.get('source')})"
    return text


def _bundle_name(bundle: dict[str, Any]) -> str:
    return str(bundle.get("bundleId") or bundle.get("source"))


def _bundle_text(bundle: dict[str, Any]) -> str:
    images = bundle.get("images") or {}
    text = (
        f"bundle {_bundle_name(bundle)}: {bundle.get('state')}, "
        f"images {images.get('present', 0)}/{images.get('total', 0)}"
    )
    if bundle.get("mediumRemovable"):
        text += ", the medium may be removed"
    progress = bundle.get("progress") or {}
    if progress.get("text"):
        text += f": {progress['text']}"
    if bundle.get("reason"):
        text += f" ({bundle['reason']}: {bundle.get('message', '')})"
    return text


def _print_set(s: dict[str, Any]) -> None:
    imgs = s["images"]
    gen = f"generation {s.get('currentGeneration', '-')}/{s['desiredGeneration']}"
    _say(
        f"set {s['name']}: {s['state']} ({gen}), images {imgs['pinned']} pinned, "
        f"{imgs['present']} present, {imgs['total']} total, {imgs['failed']} failed"
    )
    for failed in s.get("failedImages", []):
        _say(f"  {failed['reason']}: {failed['image']}: {failed['message']}")
    if s.get("lastFailedGenerationError") and not s.get("failedImages"):
        _say(f"  {s.get('reason', 'Failed')}: {s['lastFailedGenerationError']}")


# ---------------------------------------------------------------- table
def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Columns as wide as their widest cell; every cell clipped and escaped."""
    last = len(header) - 1  # the last column (a message) may run longer
    cells = [
        [clip(cell, _LAST_CELL_CHARS if i == last else _CELL_CHARS) for i, cell in enumerate(row)]
        for row in [header, *rows]
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def print_table(doc: dict[str, Any]) -> None:
    """A terminal's compact view: a summary, then tables of sets, work and bundles."""
    images = doc.get("images", {})
    ready = {c["type"]: c for c in doc.get("conditions", [])}
    state = " ".join(f"{t}={c['status']}({c['reason']})" for t, c in ready.items())
    _say(f"nodeagent  {state}  updated {doc.get('updatedAt', '?')}")
    _say(
        f"images {images.get('pinned', 0)}/{images.get('total', 0)} pinned, "
        f"{images.get('failed', 0)} failed"
        + (f"; {_disk_text(doc['disk'])}" if doc.get("disk") else "")
    )
    if doc.get("nodeMirror"):
        _say(_mirror_text(doc["nodeMirror"]))
    sets = doc.get("pinnedImageSets", [])
    if sets:
        _lines(table(
            ("SET", "STATE", "PINNED", "TOTAL", "FAILED", "GENERATION"),
            [(s["name"], s["state"], s["images"]["pinned"], s["images"]["total"],
              s["images"]["failed"], f"{s.get('currentGeneration', '-')}/{s['desiredGeneration']}")
             for s in sets],
        ))  # fmt: skip
    work = work_items(doc)
    if work:
        _lines(table(
            ("IN FLIGHT", "DONE", "TOTAL", "RATE", "LEFT"),
            [(w.what, w.done_text(), w.total_text(), w.rate_text(), w.eta_text()) for w in work],
        ))  # fmt: skip
    bundles = doc.get("bundles", [])
    if bundles:
        _lines(table(
            ("BUNDLE", "STATE", "IMAGES", "LAST OUTCOME"),
            [(_bundle_name(b), b.get("state"), _images_of(b), bundle_outcome(b))
             for b in bundles],
        ))  # fmt: skip
    _print_problems(doc)
    _print_notes(doc)  # every line the plain view has: next steps, warnings, images lost


def _images_of(bundle: dict[str, Any]) -> str:
    images = bundle.get("images") or {}
    return f"{images.get('present', 0)}/{images.get('total', 0)}"


def _print_problems(doc: dict[str, Any]) -> None:
    """What needs a person, as in the plain lines."""
    for s in doc.get("pinnedImageSets", []):
        for failed in s.get("failedImages", []):
            _say(f"{s['name']}: {failed['reason']}: {failed['image']}: {failed['message']}")
    if doc.get("lastError"):
        _say(f"last error: {doc['lastError']}")


def _lines(lines: Sequence[str]) -> None:
    sys.stdout.write("\n")
    for line in lines:
        _say(line)
