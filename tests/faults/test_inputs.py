"""Drill: the issue's crash inputs handed to the running daemon, all at once.

Each spec file below once raised out of spec loading at the first sync (the daemon exited
and systemd restarted it into the same input), or broke the journal and the status
writer. Dropped next to a good set while the daemon runs, each must become a spec problem
naming its file, the good set must stay pinned, a set written afterwards must still be
pinned, and the status file must stay whole.
"""

from __future__ import annotations

import pytest

from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_node_consistent, status_names
from tests.testenv.agent import pinned_image_set_yaml, set_state
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.drill


def _spec(name: str, extra_metadata: str = "", image: str = "{ref}") -> str:
    return (
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"
        f"metadata:\n  name: {name}\n{extra_metadata}"
        f"spec:\n  pinnedImages:\n    - name: {image}\n"
    )


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}]\n"
    for i in range(8)
)
"""Nine levels of nine-fold aliases: 9**9 (387 million) nodes once expanded, in 490 bytes."""

CRASH_INPUTS = {
    "wrong-tag": _spec("wrong-tag", "  annotations: {a: !!int x}\n"),
    "huge-number": _spec("huge-number", f"  generation: {'9' * 4301}\n"),
    "deep-brackets": _spec("deep-brackets", f"  labels: {'[' * 600}{']' * 600}\n"),
    "lone-surrogate": _spec("lone-surrogate", image='"q\\ud800"'),
    "alias-bomb": ALIAS_BOMB,
}
"""The issue's inputs that no PinnedImageSet can be read from, one file each."""

ODD_BUT_VALID = {"impossible-date": _spec("impossible-date", "  labels: {release: 2024-02-30}\n")}
"""Read as a set: a label value is a string, and ``2024-02-30`` is a valid one (it was parsed
as a YAML 1.1 date, and raised ValueError)."""


@pytest.mark.timeout(120)
async def test_crash_inputs_become_spec_problems_and_pinning_goes_on(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node()
    refs = [node.ref(r) for r in drill_images]
    steady, later = refs[:1], refs[1:2]
    node.agent.write_set("steady", steady)
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "steady") == "Pinned", what="steady pinned")
    mark = node.mark()

    files = {}
    for name, text in (CRASH_INPUTS | ODD_BUT_VALID).items():
        files[name] = node.agent.persistent_dir / f"{name}.yaml"
        files[name].write_text(text.replace("{ref}", refs[2]))
    bad = {str(files[name]) for name in CRASH_INPUTS}
    status = node.agent.wait_status(
        lambda s: (
            {p["file"] for p in s.get("specProblems", [])} >= bad
            and set_state(s, "impossible-date") == "Pinned"
        ),
        what="every crash input reported as a spec problem, the odd one pinned",
        timeout_s=60,
    )
    reasons = {p["file"]: p["reason"] for p in status["specProblems"]}
    assert {reasons[f] for f in bad} <= {"SpecInvalid", "ImageReferenceInvalid"}, reasons

    (node.agent.persistent_dir / "later.yaml").write_text(pinned_image_set_yaml("later", later))
    node.agent.wait_status(lambda s: set_state(s, "later") == "Pinned", what="later pinned")
    for path in files.values():
        path.unlink()
    node.agent.wait_status(lambda s: not s.get("specProblems"), what="no spec problem left")
    await assert_node_consistent(node, sets={"steady": steady, "later": later}, since=mark)
    assert "CRITICAL" not in node.agent.log_text()


WATCHDOG_S = 2.0
"""The watchdog the drill's daemon gets (``WATCHDOG_USEC``); it sends WATCHDOG=1 every 1 s."""


CHALLENGED_S = 20.0
"""How long the registry answers nodeagent's look-ups with the 60 KB challenge."""


@pytest.mark.drill_long
@pytest.mark.timeout(180)
async def test_huge_auth_challenges_never_starve_the_watchdog(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node()
    node.agent.extra_env["WATCHDOG_USEC"] = str(int(WATCHDOG_S * 1_000_000))
    refs = [node.ref(r) for r in drill_images[:3]]
    node.proxy.answer_errors(  # only nodeagent's look-ups: CRI-O pulls unchallenged
        401,
        for_s=CHALLENGED_S,
        match=lambda r: r.is_from_nodeagent,
        headers={"WWW-Authenticate": "Bearer " + "a" * 60_000},
    )
    node.agent.write_set("big", refs)
    node.agent.start()
    node.notify.wait_ready()
    wait_for(
        lambda: node.notify.seconds_since("WATCHDOG") is not None,
        timeout_s=WATCHDOG_S,
        what="the first WATCHDOG=1",
    )

    def fed_in_time() -> bool:
        silent_s = node.notify.seconds_since("WATCHDOG") or 0.0
        assert silent_s < WATCHDOG_S, (
            f"no WATCHDOG=1 for {silent_s:.1f}s: systemd would have killed the daemon"
        )
        return True

    # The challenge is refused at once (RegistryError: a broken answer, retried soon): the
    # sizes are unknown, the set is held and says so; the look-ups are retried within a
    # minute, and succeed once the registry stops challenging.
    wait_for(
        lambda: fed_in_time() and status_names(node, "SizeUnknown"),
        timeout_s=CHALLENGED_S,
        interval_s=0.1,
        what="the status naming SizeUnknown, the watchdog fed all along",
    )
    assert "cannot read" in node.agent.log_text()
    wait_for(  # not wait_status: there is no status file before admission is done
        lambda: fed_in_time() and set_state(node.agent.status() or {}, "big") == "Pinned",
        timeout_s=120,
        interval_s=0.1,
        what="big pinned, the watchdog fed all along",
    )
    assert max(len(line) for line in node.agent.log_text().splitlines()) < 4096
    await assert_node_consistent(node, sets={"big": refs})
