"""Anti-rollback and expiry end to end (docs/bundle-format.md#anti-rollback): signed bundles
imported with ``nodeagent bundle import`` into a real CRI-O, with no registry to fall back on.

Real parts: CRI-O, the CLI (a subprocess: the daemon's importer, the node's image store, the
loopback mirror), minisign signatures by a trusted key. The high-water mark comes from the
signed manifests in the store: removing the state files, damaging the store's records and
pruning its blobs does not reset it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.adapters.store.keeper import collect
from nodeagent.bundles import minisign
from nodeagent.store.keeping import KeepRules
from tests.testenv.agent import Agent
from tests.testenv.bundles import build_factory
from tests.testenv.crio import Crio
from tests.testenv.images import default_cache_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle

MIB = 1 << 20


def make(tmp_path: Path, keys: Keys, name: str, *, seed: int, **fields: str | int) -> Signed:
    """A bundle ``name`` of one small image of its own, its set ``name``."""
    images = [image(f"rollback/{name}", [(MIB, 1700), (MIB, seed)], default_cache_dir())]
    return signed_bundle(
        tmp_path / "bundles" / name, keys, images, bundle_id=name, set_name=name,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def import_(agent: Agent, bundle: Signed, *flags: str) -> tuple[int, dict[str, object], str]:
    done = agent.cli("bundle", "import", str(bundle.root), "--json", *flags)
    found = re.search(r"^\{\n.*^\}$", done.stdout, re.MULTILINE | re.DOTALL)
    assert found is not None, (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(found[0]), done.stdout + done.stderr


async def in_runtime(crio: Crio, bundle: Signed) -> list[str]:
    async with CriClient(crio.endpoint) as cri:
        refs = [str(i.ref) for i in bundle.manifest.images]
        return [ref for ref in refs if await cri.image_status(ref) is not None]


def store_dir(agent: Agent) -> Path:
    return agent.state_dir / "store"


def assert_refused(crio_refs: list[str], code: int, report: dict[str, object], reason: str) -> None:
    assert (code, report["state"], report["reason"]) == (65, "rejected", reason), report
    assert crio_refs == []


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys.make(tmp_path / "keys")


@pytest.fixture
def agent(tmp_path: Path, fresh_crio: Crio, keys: Keys) -> Agent:
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    return agent


async def test_an_older_bundle_is_refused_another_channels_taken_and_by_hand_logged(
    agent: Agent, fresh_crio: Crio, keys: Keys, tmp_path: Path
) -> None:
    five = make(tmp_path, keys, "release-5", seed=1705, sequence=5)
    three = make(tmp_path, keys, "release-3", seed=1703, sequence=3)
    apps = make(tmp_path, keys, "apps-3", seed=1713, sequence=3, channel="apps")

    code, report, _ = import_(agent, five)
    assert (code, report["state"]) == (0, "imported")

    code, report, _ = import_(agent, three)
    assert_refused(await in_runtime(fresh_crio, three), code, report, "BundleRollback")
    assert "sequence 3, lower than bundle release-5 (sequence 5)" in str(report["message"])
    assert list(agent.persistent_dir.glob("bundle-release-3-*")) == []
    assert not (store_dir(agent) / "bundles" / "release-3").exists()

    code, report, _ = import_(agent, apps)  # another channel of the same key
    assert (code, report["state"]) == (0, "imported")
    assert await in_runtime(fresh_crio, apps) == [str(i.ref) for i in apps.manifest.images]

    code, report, _ = import_(agent, five)  # the same bundle again: nothing to do
    assert (code, report["state"]) == (0, "imported")

    code, report, output = import_(agent, three, "--allow-rollback")
    assert (code, report["state"]) == (0, "imported"), report
    [line] = [x for x in output.splitlines() if "bundle_rollback_allowed" in x]
    for field in ("bundle=release-3", "sequence=3", "high_water=5", "high_water_bundle=release-5"):
        assert field in line, line
    assert await in_runtime(fresh_crio, three) == [str(i.ref) for i in three.manifest.images]

    code, report, _ = import_(agent, three)  # by hand once is not a new mark
    assert (code, report["reason"]) == (65, "BundleRollback")


async def test_state_removed_records_damaged_and_blobs_pruned_do_not_reset_the_mark(
    agent: Agent, fresh_crio: Crio, keys: Keys, tmp_path: Path
) -> None:
    five = make(tmp_path, keys, "line-5", seed=1725, sequence=5)
    three = make(tmp_path, keys, "line-3", seed=1723, sequence=3)
    code, report, _ = import_(agent, five)
    assert (code, report["state"]) == (0, "imported")

    for path in agent.state_dir.glob("*.json"):
        path.unlink()  # bundles.json, the ledger, the status: every state file
    (store_dir(agent) / "bundles" / "line-5" / "record.json").write_text("{damaged")
    (store_dir(agent) / "gc-marks.json").unlink(missing_ok=True)
    rules = KeepRules(gc_grace_s=0.0, keep_newest_per_channel=False)
    pruned = collect(store_dir(agent), pinned_sets=(), rules=rules)
    assert pruned.removed, "the drill must prune line-5's blobs"
    assert not list((store_dir(agent) / "blobs" / "sha256").iterdir())
    [mark] = accepted_stamps(store_dir(agent), agent.trusted_keys_dir)
    assert (mark.bundle_id, mark.sequence) == ("line-5", 5)

    code, report, _ = import_(agent, three)
    assert_refused(await in_runtime(fresh_crio, three), code, report, "BundleRollback")


async def test_an_expired_bundle_is_refused_and_imported_by_hand(
    agent: Agent, fresh_crio: Crio, keys: Keys, tmp_path: Path
) -> None:
    expired = make(tmp_path, keys, "old", seed=1733, sequence=9, expires="2020-01-01T00:00:00Z")
    code, report, _ = import_(agent, expired)
    assert_refused(await in_runtime(fresh_crio, expired), code, report, "BundleExpired")
    assert "expired at 2020-01-01T00:00:00Z" in str(report["message"])

    code, report, output = import_(agent, expired, "--allow-expired")
    assert (code, report["state"]) == (0, "imported"), report
    assert "bundle_expiry_ignored" in output and "expires=2020-01-01T00:00:00Z" in output


@pytest.mark.parametrize(
    ("args", "channel", "sequence", "lifetime"),
    [
        (["--channel", "apps", "--sequence", "7", "--expires", "30d"], "apps", 7,
         dt.timedelta(days=30)),
        ([], "default", None, None),
    ],
    ids=["given", "defaults"],
)  # fmt: skip
def test_bundle_create_writes_format_3_with_channel_sequence_and_expiry(
    tmp_path: Path, args: list[str], channel: str, sequence: int | None,
    lifetime: dt.timedelta | None,
) -> None:  # fmt: skip
    factory = build_factory(tmp_path, count=1, layer_bytes=MIB, seed=1740, extra_args=args)
    doc = json.loads((factory.bundle / "bundle.json").read_text())
    created = dt.datetime.fromisoformat(doc["created"].replace("Z", "+00:00"))
    assert (doc["formatVersion"], doc["channel"]) == (3, channel)
    assert doc["sequence"] == (int(created.timestamp()) if sequence is None else sequence)
    if lifetime is None:
        assert "expires" not in doc
    else:
        assert dt.datetime.fromisoformat(doc["expires"].replace("Z", "+00:00")) == (
            created + lifetime
        )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--sequence", "-1"),
        ("--sequence", str(1 << 53)),
        ("--channel", "a/b"),
        ("--expires", "tomorrow"),
        ("--expires", "2027-02-30T00:00:00Z"),
    ],
)
def test_bundle_create_refuses_a_bad_option_before_anything(
    tmp_path: Path, option: str, value: str
) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "nodeagent", "--config", str(tmp_path / "none.toml"), "bundle",
         "create", "--key", "k", "--output", str(tmp_path / "o"), option, value],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and option in bad.stderr, bad.stderr
    assert not (tmp_path / "o").exists()


def test_bundle_create_refuses_an_expiry_already_past(tmp_path: Path) -> None:
    past = create_refused(tmp_path, ["--expires", "2020-01-01T00:00:00Z"])
    assert past.returncode == 65 and "not after the creation time" in past.stderr, past.stderr


def create_refused(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``bundle create`` with a real key and image reference: refused before any fetch."""
    _public, secret = minisign.generate_keypair(comment="t")
    (tmp_path / "k").write_text(secret)
    ref = f"registry.invalid/a@sha256:{'a' * 64}"
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "--config", str(tmp_path / "none.toml"), "bundle",
         "create", "--key", str(tmp_path / "k"), "--output", str(tmp_path / "o"),
         "--image", ref, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
