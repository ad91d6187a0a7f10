"""Is the node consistent? The check every drill ends with, and the fault checks during it.

``assert_node_consistent`` gathers every problem it finds and fails once, listing them:

* **pins**: the pin drop-in (read through CRI-O's link, as CRI-O reads it) lists exactly the
  images of the complete sets, plus every foreign pin (``pinned_images`` of CRI-O's main
  config and of every other drop-in), plus ``kept`` (what a set whose new generation is
  incomplete had pinned); CRI ``ListImages`` says ``pinned`` for every stored image named
  there and for no other;
* **the link**: it is a symlink to the pin file in the transient dir and resolves now; the
  ``LinkWatch`` never saw it dangle nor its target fail to parse during the drill;
* **no half-written file**: no ``.<name>.<random>.tmp`` left in the state, spec, drop-in
  and registries directories; every JSON file of the state dir parses as an object;
* **no duplicate pulls** since a ``Mark``: nodeagent logged ``image_pulled`` at most once per
  image, and CRI-O never started pulling an image after it had logged it ``Pulled`` (an
  image stored is never fetched again);
* **the status**: each expected set is ``Pinned`` at its desired generation with every image
  pinned, no other set is reported, and nothing is ``Degraded``.

While a fault lasts, ``status_names`` / ``wait_status_names`` / ``hold_status_names`` say
whether the status names it: a ``reason`` anywhere in ``status.json`` (a set's, a failed
image's, a condition's, a spec problem's, a bundle's) or the ``(Reason)`` of the last
``STATUS=`` line.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodeagent.adapters.cri.client import CriClient
from nodeagent.ports import StoredImage
from tests.faults.node import DROPIN, DrillNode, Mark, pins_of
from tests.testenv.agent import set_status
from tests.testenv.waiting import WaitTimeout, log_tail, wait_for

TMP_NAME = re.compile(r"^\..+\.[0-9a-f]+\.tmp$")
"""``adapters/files``' temporary names: ``.<name>.<random hex>.tmp``."""


# ---------------------------------------------------------------- the status names the fault
def reasons_in(doc: Any) -> set[str]:
    """Every value of a ``reason`` key anywhere in a JSON document."""
    if isinstance(doc, dict):
        found = {str(doc["reason"])} if isinstance(doc.get("reason"), str) else set()
        return found.union(*(reasons_in(value) for value in doc.values()))
    if isinstance(doc, list):
        return set().union(*(reasons_in(item) for item in doc))
    return set()


def status_names(node: DrillNode, reason: str) -> bool:
    """Whether the status file or the last ``STATUS=`` line names ``reason`` now."""
    status = node.agent.status() or {}
    lines = node.notify.statuses()
    return reason in reasons_in(status) or bool(lines and f"({reason})" in lines[-1])


def wait_status_names(node: DrillNode, reason: str, *, timeout_s: float) -> None:
    wait_for(
        lambda: status_names(node, reason),
        timeout_s=timeout_s,
        interval_s=0.1,
        what=f"the status to name {reason}",
        detail=lambda: _status_detail(node),
    )


def hold_status_names(node: DrillNode, reason: str, *, for_s: float) -> None:
    """The status names ``reason`` at every look (every 0.2 s) for ``for_s`` seconds."""
    hold(
        lambda: status_names(node, reason),
        for_s=for_s,
        what=f"the status naming {reason}",
        detail=lambda: _status_detail(node),
    )


def hold(
    condition: Callable[[], object],
    *,
    for_s: float,
    what: str,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """``condition`` holds (truthy, no assertion failing) at every look for ``for_s`` seconds."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        assert condition(), (
            f"{what} stopped {deadline - time.monotonic():.1f}s before the end\n{detail()}"
        )
        time.sleep(0.2)


def wait_settled(node: DrillNode, *, changes_before: int, timeout_s: float = 30) -> None:
    """The daemon saw a change after ``changes_before`` (a count of ``files_changed``), and
    its last sync came after its last change, for half a second in a row."""

    def settled() -> bool:
        log = node.agent.current_run_log()
        return log.count("files_changed") > changes_before and log.rfind(
            "sync_finished"
        ) > log.rfind("files_changed")

    def settled_for_half_a_second() -> bool:
        if not settled():
            return False
        time.sleep(0.5)
        return settled()

    wait_for(
        settled_for_half_a_second,
        timeout_s=timeout_s,
        what="the daemon to sync after the last change",
        detail=lambda: log_tail(node.agent.log_path),
    )


def _status_detail(node: DrillNode) -> str:
    lines = node.notify.statuses()
    return (
        f"status.json: {json.dumps(node.agent.status())}\n"
        f"last STATUS=: {lines[-1] if lines else None}\n{log_tail(node.agent.log_path)}"
    )


# ---------------------------------------------------------------- the check
async def assert_node_consistent(
    node: DrillNode,
    *,
    sets: Mapping[str, Sequence[str]],
    since: Mark | None = None,
    kept: Iterable[str] = (),
) -> None:
    """Every check above; ``sets`` are the sets that must be complete and pinned."""
    stored = await stored_images(node)
    problems = [
        *link_problems(node),
        *half_written_problems(node),
        *pin_problems(node, sets, stored, set(kept)),
        *status_problems(node, sets),
        *duplicate_pull_problems(node, since or Mark()),
    ]
    assert not problems, (
        "the node is not consistent:\n- "
        + "\n- ".join(problems)
        + ("\n" + log_tail(node.agent.log_path))
    )


async def assert_holding(node: DrillNode, *, sets: Mapping[str, Sequence[str]]) -> None:
    """While a fault lasts: the link holds, no half-written file, and exactly ``sets``'
    images (plus the foreign pins) are pinned; CRI is asked only while CRI-O runs."""
    problems = [*link_problems(node), *half_written_problems(node)]
    if node.crio.process is not None:
        problems += pin_problems(node, sets, await stored_images(node), set())
    assert not problems, "while the fault lasts:\n- " + "\n- ".join(problems)


async def stored_images(node: DrillNode) -> list[StoredImage]:
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        return await cri.list_images()


def link_problems(node: DrillNode) -> list[str]:
    link, target = node.link, node.target
    problems = [f"link watch: {s.what} at {s.at_s:.3f}" for s in node.watch.sightings[:5]]
    if not link.is_symlink():
        return [*problems, f"{link} is not a symlink"]
    if link.resolve() != target.resolve():
        problems.append(f"{link} points to {link.readlink()}, not {target}")
    if not link.exists():
        problems.append(f"{link} dangles")
    return problems


def half_written_problems(node: DrillNode) -> list[str]:
    agent, crio = node.agent, node.crio
    dirs = [
        agent.state_dir,
        agent.persistent_dir,
        agent.transient_dir,
        agent.transient_dropin_dir,
        crio.dropin_dir,
        crio.registries_dir,
    ]
    return half_written_in(dirs, agent.state_dir)


def half_written_in(dirs: Iterable[Path], state_dir: Path) -> list[str]:
    """Temporary files of atomic writes left in ``dirs``; JSON files of ``state_dir`` (its
    store's records included) that do not parse as an object."""
    problems = [f"temporary file left: {path}" for path in _lasting_temporaries(dirs)]
    for path in sorted(state_dir.rglob("*.json")):
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as err:
            problems.append(f"{path} does not parse: {err}")
            continue
        if not isinstance(doc, dict):
            problems.append(f"{path} holds a {type(doc).__name__}, not an object")
    return problems


TMP_GRACE_S = 5.0
"""A running daemon's atomic write holds its temporary file for milliseconds; one still
there this long after it was seen was left behind."""


def _lasting_temporaries(dirs: Iterable[Path]) -> list[Path]:
    """Temporary files of atomic writes that stay: a write in progress when the check looks
    (a status write of a daemon that runs through the fault) is not one."""
    dirs = [d for d in dirs if d.exists()]

    def temporaries() -> set[Path]:
        return {p for d in dirs for p in d.rglob("*") if TMP_NAME.match(p.name)}

    seen = temporaries()
    if not seen:
        return []
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not (seen & temporaries()), timeout_s=TMP_GRACE_S, what="writes")
    return sorted(seen & temporaries())


def foreign_pins(node: DrillNode) -> set[str]:
    """``pinned_images`` of CRI-O's main config and of every drop-in but nodeagent's."""
    others = (p for p in node.crio.dropin_dir.rglob("*") if p.is_file() and p.name != DROPIN)
    files = [node.crio.config_file, *sorted(others)]
    return {pin for path in files for pin in pins_of(path.read_text())}


def pin_problems(
    node: DrillNode, sets: Mapping[str, Sequence[str]], stored: list[StoredImage], kept: set[str]
) -> list[str]:
    try:
        pins = set(pins_of(node.link.read_text()))
    except (OSError, tomllib.TOMLDecodeError, TypeError) as err:
        return [f"the pin drop-in cannot be read through {node.link}: {err}"]
    names = {name: image for image in stored for name in image.names()}
    problems = []
    for name, refs in sets.items():
        missing = [ref for ref in refs if ref not in names]
        if missing:
            problems.append(f"set {name} is not complete: {missing} not stored")
    complete = {ref for refs in sets.values() for ref in refs if ref in names}
    expected = complete | foreign_pins(node) | kept
    if pins != expected:
        problems.append(
            f"pins differ from complete sets + foreign pins: extra {sorted(pins - expected)}, "
            f"missing {sorted(expected - pins)}"
        )
    for image in stored:
        should = any(name in expected for name in image.names())
        if image.is_pinned != should:
            problems.append(f"CRI says pinned={image.is_pinned} for {image.names()}")
    return problems


def status_problems(node: DrillNode, sets: Mapping[str, Sequence[str]]) -> list[str]:
    status = node.agent.status()
    if status is None:
        return ["no status file"]
    problems = []
    for name, refs in sets.items():
        item = set_status(status, name)
        if item is None:
            problems.append(f"set {name} is not in the status")
            continue
        if item["state"] != "Pinned" or item["images"]["pinned"] != len(refs):
            problems.append(f"set {name}: {item['state']}, images {item['images']}")
        if item.get("currentGeneration") != item["desiredGeneration"]:
            problems.append(f"set {name}: generations {item}")
    others = [s["name"] for s in status.get("pinnedImageSets", []) if s["name"] not in sets]
    if others:
        problems.append(f"the status reports sets that do not exist: {others}")
    degraded = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
    if not degraded or degraded[0]["status"] != "False":
        problems.append(f"Degraded: {degraded}")
    return problems


_PULLED = re.compile(r"^image_pulled: image=(\S+)", re.MULTILINE)
_CRIO_PULL = re.compile(r'msg="(Pulling|Pulled) image: ([^"]+)"')


def duplicate_pull_problems(node: DrillNode, since: Mark) -> list[str]:
    counts = Counter(_PULLED.findall(node.agent_log_since(since)))
    problems = [f"nodeagent pulled {ref} {n} times" for ref, n in counts.items() if n > 1]
    stored: set[str] = set()
    for step, ref in _CRIO_PULL.findall(node.crio_log_since(since)):
        if step == "Pulled":
            stored.add(ref)
        elif ref in stored:
            problems.append(f"CRI-O pulled {ref} again although it was stored")
    return problems
