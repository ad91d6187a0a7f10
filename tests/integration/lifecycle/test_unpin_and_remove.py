"""``nodeagent unpin`` and ``nodeagent bundle remove`` with the real daemon, CRI-O and store
(decision 0072).

Two signed bundles share a layer; a local set file pins one of their images too. Proven:
``bundle remove`` refuses a bundle whose set is pinned (65) and runs beside no daemon (75
beside one); ``unpin`` of a bundle set and of a local set beside the running daemon removes
the file and the daemon unpins it in CRI-O; with the daemon stopped ``unpin`` runs the sync
itself (CRI-O no longer pins the image); ``bundle remove`` then takes out only the blobs no
other bundle refers to, and keeps the signed manifest and its signature; unknown names
exit 66 with one ``error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.testenv.agent import Agent, pinned_image_set_yaml, set_state
from tests.testenv.crio import Crio
from tests.testenv.images import default_cache_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.waiting import wait_for
from tests.unit.cli import schemas

pytestmark = pytest.mark.integration

MIB = 1 << 20


def error_line(done: object) -> str:
    [line] = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert "; what to do: " in line
    return str(line)


def pinned_refs(agent: Agent) -> set[str]:
    done = agent.cli("runtime", "--json")
    assert done.returncode == 0, done.stderr
    return {n for i in json.loads(done.stdout)["images"] if i["pinned"] for n in i["names"]}


def bundles(tmp_path: Path) -> tuple[Keys, Signed, Signed]:
    keys = Keys.make(tmp_path / "keys")
    cache = default_cache_dir()
    a = image("lifecycle/a", [(MIB, 2701), (MIB, 2702)], cache)
    b = image("lifecycle/b", [(MIB, 2701), (MIB, 2703)], cache)
    one = signed_bundle(tmp_path / "a", keys, [a], bundle_id="life-a", set_name="set-a", sequence=1)
    two = signed_bundle(tmp_path / "b", keys, [b], bundle_id="life-b", set_name="set-b", sequence=2)
    return keys, one, two


@pytest.mark.timeout(180)
def test_unpin_and_bundle_remove_with_the_daemon_and_without(
    tmp_path: Path, fresh_crio: Crio
) -> None:
    keys, one, two = bundles(tmp_path)
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    for signed in (one, two):
        done = agent.cli("bundle", "import", str(signed.root))
        assert done.returncode == 0, done.stdout + done.stderr
    ref_a, ref_b = (str(s.manifest.images[0].ref) for s in (one, two))
    (agent.persistent_dir / "local-b.yaml").write_text(pinned_image_set_yaml("local-b", [ref_b]))
    assert {ref_a, ref_b} <= pinned_refs(agent)

    done = agent.cli("bundle", "remove", "life-a")
    assert done.returncode == 65
    assert error_line(done).startswith("error: BundleSetsPinned: bundle life-a's set set-a ")
    done = agent.cli("bundle", "remove", "no-such-bundle")
    assert done.returncode == 66 and error_line(done).startswith("error: BundleNotStored: ")
    done = agent.cli("unpin", "no-such-set")
    assert done.returncode == 66 and error_line(done).startswith("error: SetNotFound: ")

    with agent:
        agent.wait_status(lambda s: set_state(s, "local-b") == "Pinned", what="local-b pinned")
        done = agent.cli("bundle", "remove", "life-a")
        assert done.returncode == 75 and error_line(done).startswith("error: DaemonRunning: ")
        done = agent.cli("unpin", "set-a", "--json")
        assert done.returncode == 0, done.stderr
        doc = schemas.check("unpin", done.stdout)
        assert (doc["source"], doc["bundleId"], doc["by"]) == ("bundle", "life-a", "daemon")
        done = agent.cli("unpin", "local-b")
        assert done.returncode == 0, done.stderr
        assert "the running daemon unpins it" in done.stdout
        agent.wait_status(
            lambda s: set_state(s, "set-a") is None and set_state(s, "local-b") is None,
            what="set-a and local-b unpinned by the daemon",
        )
        wait_for(lambda: ref_a not in pinned_refs(agent), timeout_s=30, what="a unpinned")
        assert ref_b in pinned_refs(agent)  # set-b still pins it

    done = agent.cli("unpin", "set-b")  # no daemon: the command syncs
    assert done.returncode == 0, done.stderr
    assert "sync: " in done.stdout
    assert ref_b not in pinned_refs(agent)

    store = agent.state_dir / "store"
    shared, own = (layer.blob().digest for layer in one.images[0].layers)
    done = agent.cli("bundle", "remove", "life-a", "--json")
    assert done.returncode == 0, done.stderr
    removed = schemas.check("bundle-remove", done.stdout)
    assert removed["keptBlobs"] == 1 and removed["removedBlobs"] >= 3  # manifest, config, own
    blobs = store / "blobs" / "sha256"
    assert (blobs / shared.removeprefix("sha256:")).is_file()  # life-b still refers to it
    assert not (blobs / own.removeprefix("sha256:")).exists()
    kept = store / "bundles" / "life-a"
    assert (kept / "bundle.json").is_file() and (kept / "bundle.json.minisig").is_file()
    done = agent.cli("bundle", "remove", "life-b")
    assert done.returncode == 0, done.stderr
    assert "removed " in done.stdout and not (blobs / shared.removeprefix("sha256:")).exists()
