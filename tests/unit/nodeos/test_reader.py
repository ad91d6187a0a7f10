"""``adapters.nodeos.NodeOsReader``: real processes standing in for bootc and rpm-ostree.

Each stand-in is a shell script that prints a recorded output (fixtures/) or misbehaves:
fails, hangs, floods. The reader bounds each, leaves that part out and keeps the rest.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from nodeagent.adapters.nodeos import NodeOsReader, ToolFailed, run_tool
from nodeagent.nodeos import MAX_TOOL_OUTPUT_BYTES

FIXTURES = Path(__file__).parent / "fixtures"


def tool(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def prints(fixture: str) -> str:
    return f"cat {shlex.quote(str(FIXTURES / fixture))}"


def reader(root: Path, *, timeout_s: float = 10.0) -> NodeOsReader:
    return NodeOsReader(
        os_release=root / "os-release",
        bootc=root / "bootc",
        rpm_ostree=root / "rpm-ostree",
        timeout_s=timeout_s,
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "os-release").write_bytes((FIXTURES / "os-release-rhcos").read_bytes())
    return tmp_path


async def test_rhcos_with_rpm_ostree_only(root: Path) -> None:
    tool(root, "rpm-ostree", prints("rpm-ostree-status-container.json"))
    found = (await reader(root).read()).to_json()
    assert found["versionId"] == "4.18"
    assert found["booted"]["source"] == "rpm-ostree"
    assert found["booted"]["digest"].startswith("sha256:1b2c3d4e")


async def test_bootc_is_asked_first_and_rpm_ostree_not_run(root: Path) -> None:
    tool(
        root,
        "bootc",
        f'[ "$*" = "status --format json" ] || exit 9\n{prints("bootc-status-booted.json")}',
    )
    tool(root, "rpm-ostree", f"touch {shlex.quote(str(root / 'ran'))}; exit 1")
    found = (await reader(root).read()).to_json()
    assert found["booted"]["source"] == "bootc"
    assert not (root / "ran").exists()


async def test_no_tools_and_no_os_release_is_an_empty_answer(tmp_path: Path) -> None:
    assert (await reader(tmp_path).read()).to_json() == {}


async def test_a_failing_bootc_falls_back_to_rpm_ostree(root: Path) -> None:
    tool(root, "bootc", "echo 'error: not a bootc host' >&2; exit 1")
    tool(root, "rpm-ostree", prints("rpm-ostree-status-container.json"))
    found = (await reader(root).read()).to_json()
    assert found["booted"]["source"] == "rpm-ostree"


@pytest.mark.parametrize(
    "body",
    [
        "exec sleep 30",  # hangs: stopped at the timeout
        f"head -c {MAX_TOOL_OUTPUT_BYTES + 10} /dev/zero",  # floods
        "echo '{\"deployments\": [}'",  # not JSON
        "echo 'Unit rpm-ostreed.service not found' >&2; exit 1",
    ],
    ids=["hangs", "floods", "garbage", "fails"],
)
async def test_a_misbehaving_tool_leaves_only_its_part_out(root: Path, body: str) -> None:
    tool(root, "rpm-ostree", body)
    started = time.monotonic()
    found = (await reader(root, timeout_s=1.0).read()).to_json()
    assert time.monotonic() - started < 10
    assert found["id"] == "rhcos"
    assert "booted" not in found


async def test_run_tool_says_why(tmp_path: Path) -> None:
    failing = tool(tmp_path, "t", "echo 'boom' >&2; exit 3")
    with pytest.raises(ToolFailed, match="exited with status 3: boom"):
        await run_tool([str(failing)], timeout_s=5, max_bytes=100)
    flooding = tool(tmp_path, "f", "head -c 1000 /dev/zero")
    with pytest.raises(ToolFailed, match="more than 100 bytes"):
        await run_tool([str(flooding)], timeout_s=5, max_bytes=100)
    hanging = tool(tmp_path, "h", "exec sleep 30")
    with pytest.raises(ToolFailed, match=r"did not answer within 0\.5 s"):
        await run_tool([str(hanging)], timeout_s=0.5, max_bytes=100)
