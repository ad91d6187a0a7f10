"""nodeagent as a node runs it: the RPM's unit under a real systemd, next to CRI-O's.

Every check reads what systemd, journald and CRI-O say (``systemctl show``, ``journalctl``,
CRI over the container's socket), never nodeagent's own word for it alone.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.journal import MESSAGE_IDS
from nodeagent.logs import event_of
from tests.conftest import Pushed
from tests.testenv.agent import set_state
from tests.testenv.node import Node

SET = "e2e-web"
STATUS_LINE = re.compile(r"^pinned (\d+)/(\d+) images$")


@dataclass(frozen=True)
class PinnedSet:
    name: str
    refs: list[str]


@pytest.fixture(scope="module")
def pinned_set(node: Node, pushed: Pushed) -> PinnedSet:
    """A PinnedImageSet dropped into the spec dir, waited for until nodeagent says Pinned."""
    refs = [pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)]
    node.write_set(SET, refs)
    node.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned")
    return PinnedSet(SET, refs)


async def pinned_flags(node: Node, refs: list[str]) -> list[bool]:
    async with CriClient(node.cri_endpoint) as cri:
        found = [await cri.image_status(ref) for ref in refs]
    return [image is not None and image.is_pinned for image in found]


def event_messages(node: Node, event: str, *matches: str) -> list[str]:
    entries = node.journal_entries("-u", "nodeagent", f"NODEAGENT_EVENT={event}", *matches)
    return [str(e["MESSAGE"]) for e in entries]


def test_nodeagent_is_ready_before_crio_starts(node: Node) -> None:
    agent = node.show(
        "nodeagent.service", "Type", "ActiveState", "SubState", "NRestarts", "WatchdogUSec"
    )
    assert (agent["Type"], agent["ActiveState"], agent["SubState"]) == (
        "notify",
        "active",
        "running",
    )
    assert agent["NRestarts"] == "0"
    assert agent["WatchdogUSec"] == "2min"
    # Type=notify: systemd says "Started" on READY=1. Before=crio.service: CRI-O is started
    # only after that, so it reads the pins nodeagent rendered (this boot, first time each).
    manager = node.journal("-b", "_PID=1", "-o", "cat").splitlines()
    ready = next(i for i, line in enumerate(manager) if line.startswith("Started nodeagent"))
    crio = next(i for i, line in enumerate(manager) if line.startswith("Starting crio.service"))
    assert ready < crio
    # CRI-O not answering yet is expected at boot: no warning for a technician to chase. The
    # offline drill's verdict (this node has no kubelet and no pause image) is a finding of
    # its own, made after the first sync: never about CRI-O not answering yet.
    warnings = node.journal("-b", "-u", "nodeagent", "-p", "warning", "-o", "cat").splitlines()
    others = [line for line in warnings if event_of(line) != "offline_not_ready"]
    assert others == []
    assert not any("RuntimeUnreachable" in line for line in warnings), warnings
    lines = node.journal("-b", "-u", "nodeagent", "-o", "cat").splitlines()
    rendered = next(i for i, line in enumerate(lines) if "99-nodeagent-pinned-images" in line)
    started = next(i for i, line in enumerate(lines) if line.startswith("daemon_started"))
    assert rendered < started, "ExecStartPre render-pins ran before the daemon"


async def test_set_is_pulled_and_pinned_and_the_status_line_says_so(
    node: Node, pinned_set: PinnedSet
) -> None:
    assert await pinned_flags(node, pinned_set.refs) == [True, True]
    text = node.show("nodeagent.service", "StatusText")["StatusText"]
    counts = STATUS_LINE.match(text)
    assert counts is not None, text
    assert counts.group(1) == counts.group(2)
    assert int(counts.group(2)) >= len(pinned_set.refs)
    status = node.container.systemctl("status", "nodeagent.service").stdout
    assert f'Status: "{text}"' in status


def test_journal_carries_fields_and_the_catalog_explains(node: Node, pinned_set: PinnedSet) -> None:
    of_set = node.journal_entries(f"NODEAGENT_SET={pinned_set.name}")
    assert of_set, "no entry with NODEAGENT_SET"
    assert {e["NODEAGENT_SET"] for e in of_set} == {pinned_set.name}
    pinned = [e for e in of_set if e["NODEAGENT_EVENT"] == "set_pinned"]
    assert pinned
    assert pinned[-1]["MESSAGE_ID"] == MESSAGE_IDS["set_pinned"]
    assert pinned[-1]["_SYSTEMD_UNIT"] == "nodeagent.service"
    assert pinned[-1]["PRIORITY"] == "6"
    for ref in pinned_set.refs:
        pulled = node.journal_entries(f"NODEAGENT_IMAGE={ref}", "NODEAGENT_EVENT=image_pulled")
        assert pulled, ref
    explained = node.journal("-x", "-u", "nodeagent", f"MESSAGE_ID={MESSAGE_IDS['set_pinned']}")
    assert "Subject: The images of a PinnedImageSet are pinned" in explained
    assert f"Every image of PinnedImageSet {pinned_set.name} is stored" in explained


def test_support_dump_holds_the_units_journal(node: Node, pinned_set: PinnedSet) -> None:
    # issue 28 item 7: the excerpt comes from the real journald of a node under systemd
    node.container.run("nodeagent", "support-dump", "--output", "/root/support.tar.gz")
    with tarfile.open(node.container.live("/root/support.tar.gz")) as archive:
        names = set(archive.getnames())
        member = archive.extractfile("journal.txt")
        assert member is not None, names
        journal = member.read().decode()
    assert {"README.txt", "status.json", "journal.txt"} <= names, names
    assert "set_pinned" in journal and pinned_set.name in journal, journal[-2000:]
    assert "nodeagent" in journal.splitlines()[-1], journal[-500:]


def test_reloads_went_through_systemd_not_sighup(node: Node, pinned_set: PinnedSet) -> None:
    reloads = event_messages(node, "runtime_reloaded")
    assert reloads, "nodeagent never reloaded CRI-O"
    assert all("path=dbus" in m and "unit=crio.service" in m for m in reloads), reloads
    for fallback in ("system_bus_unreachable", "systemd_not_on_bus", "runtime_signalled"):
        assert event_messages(node, fallback) == [], fallback
    systemd_lines = node.journal("-u", "crio", "-o", "cat", "_PID=1")
    assert systemd_lines.count("Reloaded crio.service") >= len(reloads)
    assert "Configuration reload completed" in node.journal("-u", "crio", "-o", "cat")


async def test_stop_is_clean_and_the_unit_starts_again(node: Node, pinned_set: PinnedSet) -> None:
    before = node.show("nodeagent.service", "InvocationID")["InvocationID"]
    node.container.systemctl("stop", "nodeagent.service")
    stopped = node.show(
        "nodeagent.service", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus"
    )
    assert stopped == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainCode": "1",  # CLD_EXITED: it exited by itself, no signal killed it
        "ExecMainStatus": "0",
    }
    run = node.journal("-o", "cat", f"_SYSTEMD_INVOCATION_ID={before}")
    assert "daemon_stopping" in run
    assert "daemon_stopped" in run
    manager = node.journal("-u", "nodeagent", "-o", "cat", "_PID=1")
    assert "timed out" not in manager
    assert "Killing process" not in manager

    node.container.systemctl("start", "nodeagent.service")
    node.wait_active("nodeagent.service")
    finished = node.wait_event("sync_finished")
    assert "pinned" in str(finished["MESSAGE"])
    assert await pinned_flags(node, pinned_set.refs) == [True, True]


def test_security_exposure_of_the_running_unit(node: Node) -> None:
    analysis = node.container.run(
        "systemd-analyze", "security", "--no-pager", "nodeagent.service"
    ).stdout
    overall = re.search(r"Overall exposure level for nodeagent.service: (\d+\.\d+) (\w+)", analysis)
    assert overall is not None, analysis[-2000:]
    assert float(overall.group(1)) <= 3.0, overall.group(0)


def test_the_rpm_installs_bash_completion_that_completes(node: Node) -> None:
    """The completion file the RPM installs, loaded into the node's own bash."""
    script = (
        "source /usr/share/bash-completion/completions/nodeagent; "
        "COMP_WORDS=(nodeagent render-p); COMP_CWORD=1; _nodeagent; echo ${COMPREPLY[@]}; "
        "COMP_WORDS=(nodeagent render-pins --con); COMP_CWORD=2; _nodeagent; echo ${COMPREPLY[@]}"
    )
    lines = node.container.run("bash", "-c", script).stdout.splitlines()
    assert lines == ["render-pins", "--config"], lines
