"""``bundle import --allow-rollback LABEL=NAME``: the command mounts the stick read-only itself.

Real parts: systemd-udevd (the label and filesystem type come from its database), an ext4
loop device, CRI-O, the CLI as a subprocess. An older bundle on the stick is refused in
one ``error:`` line with the stick unmounted after, then imported with ``--allow-rollback``
and pinned, the stick unmounted again; nothing is left mounted and no mount point remains.
The label is not ``NODEAGENT*``, so no daemon's media watcher on this machine takes the
stick (run under the shared e2e lock all the same). About 10 s.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.bundles.test_rollback import import_, in_runtime, make
from tests.testenv.agent import Agent
from tests.testenv.bundles import ext4_media
from tests.testenv.crio import Crio
from tests.testenv.signed_bundles import Keys
from tests.testenv.udev import LoopMedia, Udevd

LABEL = f"HANDIMPORT{os.getpid() % 100000}"


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def stick(tmp_path: Path) -> Iterator[list[LoopMedia]]:
    media: list[LoopMedia] = []
    yield media
    for m in media:
        if m.devnode is not None:
            subprocess.run(["umount", "--lazy", m.devnode], check=False)
            m.detach()


def mounts_of(devnode: str, media_dir: Path) -> list[str]:
    """Mount points of ``devnode`` or under ``media_dir`` (/proc/self/mountinfo)."""
    real = os.path.realpath(devnode)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        source = fields[fields.index("-") + 2]
        if source == real or fields[4].startswith(str(media_dir)):
            found.append(fields[4])
    return found


@pytest.mark.timeout(120)
async def test_an_older_bundle_on_a_stick_is_refused_then_imported_by_label_with_allow_rollback(
    udevd: Udevd, fresh_crio: Crio, tmp_path: Path, stick: list[LoopMedia]
) -> None:
    keys = Keys.make(tmp_path / "keys")
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    five = make(tmp_path, keys, "stick-5", seed=1805, sequence=5)
    three = make(tmp_path, keys, "stick-3", seed=1803, sequence=3)
    code, report, _ = import_(agent, five)
    assert (code, report["state"]) == (0, "imported"), report

    media = ext4_media(tmp_path, three.root, label=LABEL)
    stick.append(media)
    devnode = media.attach()
    media.wait_in_udev_db("ID_FS_LABEL", LABEL)

    refused = agent.cli("bundle", "import", f"LABEL={LABEL}")
    assert refused.returncode == 65, refused.stderr
    [line] = refused.stderr.splitlines()  # one line: no journal lines, no traceback
    assert line.startswith("error: BundleRollback: ") and "; what to do: " in line, line
    assert mounts_of(devnode, agent.media_dir) == []
    assert await in_runtime(fresh_crio, three) == []

    taken = agent.cli("bundle", "import", f"LABEL={LABEL}", "--allow-rollback", "--json")
    assert taken.returncode == 0, taken.stderr
    assert '"state": "imported"' in taken.stdout
    for event in ("media_mounted", "bundle_rollback_allowed", "media_unmounted"):
        assert event in taken.stderr, event
    assert mounts_of(devnode, agent.media_dir) == []
    assert not list(agent.media_dir.glob("by-hand-*"))
    refs = [str(i.ref) for i in three.manifest.images]
    assert await in_runtime(fresh_crio, three) == refs
    # by its device node too: the same bundle again, nothing to do, unmounted again
    again = agent.cli("bundle", "import", devnode, "--allow-rollback")
    assert again.returncode == 0, again.stderr
    assert mounts_of(devnode, agent.media_dir) == []
