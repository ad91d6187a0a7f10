"""``nodeagent support-dump --to-stick`` with a real udevd and a loop-device stick (decision
0072): the one stick nodeagent takes is found as the daemon's media watcher finds it,
mounted writable but nosuid, nodev and noexec in the run directory, the archive written
there (0600), and unmounted; with no stick the command says so (``StickNotFound``, 75).
Run under the shared lock (tests/helpers' e2e.lock): another test's NODEAGENT stick would
be a second one."""

from __future__ import annotations

import json
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.bundles.test_importer import mounted_below
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.udev import LoopMedia, Udevd

pytestmark = pytest.mark.integration

LABEL = "NODEAGENT-DUMP"


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.mark.usefixtures("udevd")
@pytest.mark.timeout(120)
def test_the_archive_goes_to_the_one_stick_and_it_is_unmounted(
    tmp_path: Path, fresh_crio: Crio
) -> None:
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    done = agent.cli("support-dump", "--to-stick")
    assert done.returncode == 75, done.stderr
    assert "error: StickNotFound: --to-stick needs one stick labelled NODEAGENT*" in done.stderr

    media = LoopMedia.create(tmp_path / "media", "ext4", label=LABEL, size_mib=32)
    media.attach()
    try:
        media.wait_in_udev_db("ID_FS_LABEL", LABEL)
        done = agent.cli("support-dump", "--to-stick", "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        name = Path(doc["path"]).name
        assert doc["path"].startswith(f"{media.devnode} ({LABEL})/nodeagent-support-")
        assert mounted_below(agent.run_dir) == []
        assert not (agent.run_dir / "support-stick").exists()
        look = tmp_path / "look"
        look.mkdir()
        subprocess.run(["mount", "-o", "ro", str(media.devnode), str(look)], check=True)
        try:
            archive = look / name
            assert stat.S_IMODE(archive.stat().st_mode) == 0o600
            assert archive.stat().st_size == doc["sizeBytes"]
            with tarfile.open(archive, "r:gz") as tar:
                assert "runtime.json" in tar.getnames() and "README.txt" in tar.getnames()
        finally:
            subprocess.run(["umount", str(look)], check=True)
    finally:
        media.unplug()
