"""Each command's ``--json`` document against the schema docs/cli.md documents for it.

The commands run through ``nodeagent``'s entry point against a temporary root; those that
need CRI-O or a registry (runtime, pull, check-offline, bundle create, bundle import) are
checked in tests/integration/cli/test_json_documents.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.cli import main as cli
from nodeagent.cli import output
from nodeagent.cli import site as cli_site
from nodeagent.ports import PullEvent, PullStep
from nodeagent.progress import ByteProgress
from nodeagent.reporting import PullTally, Reporter
from nodeagent.status import BundleReport, SetStatus, node_status
from tests.fakes.ports import RecordingLine
from tests.testenv.signed_bundles import HOST, Keys, Signed, image, signed_bundle, with_served_tags
from tests.unit.cli import schemas
from tests.unit.test_cli_site import BUNDLE, ScriptedApi, node, status

MIB = 1 << 20
DOCS = schemas.DOCS / "cli.md"


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def run_json(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> tuple[int, str]:
    code = cli.main([*argv, "--json", "--root", str(root)])
    return code, capsys.readouterr().out


# ---------------------------------------------------------------- the schemas themselves
@pytest.mark.parametrize("command", sorted(output.SCHEMA_VERSIONS))
def test_each_schema_is_documented_with_its_id(command: str) -> None:
    schema = schemas.load(command)
    assert schema["$id"] == output.schema_id(command) == f"nodeagent.{command}/v1"
    assert schema["properties"]["schema"] == {"const": schema["$id"]}
    assert "schema" in schema["required"]
    text = DOCS.read_text()
    assert f"`{schema['$id']}`" in text
    assert f"docs/cli/{command}.schema.json" in text


def test_no_schema_file_without_a_command() -> None:
    files = {p.name.removesuffix(".schema.json") for p in schemas.SCHEMA_DIR.glob("*.json")}
    assert files == set(output.SCHEMA_VERSIONS)


def test_the_validator_refuses_what_breaks_a_schema() -> None:
    schema = schemas.load("pull")
    good = {"schema": "nodeagent.pull/v1", "pulled": [{"image": "a", "imageRef": "b"}]}
    assert schemas.errors(good, schema) == []
    assert schemas.errors(good | {"schema": "nodeagent.pull/v2"}, schema)
    assert schemas.errors({"schema": "nodeagent.pull/v1"}, schema)  # lacks pulled
    assert schemas.errors(good | {"pulled": [{"image": 1, "imageRef": "b"}]}, schema)
    assert schemas.errors(good | {"extra": True}, schema) == []  # fields may be added


# ---------------------------------------------------------------- commands
def test_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = tmp_path / "etc/nodeagent/pinnedimagesets.d"
    specs.mkdir(parents=True)
    (specs / "ok.yaml").write_text(
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\n"
        "metadata: {name: ok}\n"
        f"spec: {{pinnedImages: [{{name: 'r.test/a@sha256:{'a' * 64}'}}]}}\n"
    )
    assert run_json(capsys, tmp_path, "check-config")[0] == 0
    (specs / "bad.yaml").write_text("x: [\n")
    code, text = run_json(capsys, tmp_path, "check-config")
    doc = schemas.check("check-config", text)
    assert code == 65 and [s["name"] for s in doc["sets"]] == ["ok"]
    (problem,) = doc["problems"]
    assert problem["reason"] == "SpecInvalid" and problem["message"].count("bad.yaml") == 1


def test_render_pins_printed_written_and_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "etc/crio/crio.conf.d").mkdir(parents=True)
    actions = []
    for argv in (["render-pins"], ["render-pins", "--write"], ["render-pins", "--write"]):
        code, text = run_json(capsys, tmp_path, *argv)
        assert code == 0
        actions.append(schemas.check("render-pins", text)["action"])
    assert actions == ["printed", "wrote", "unchanged"]


def reported_status(state_dir: Path) -> None:
    """The status file as the daemon's reporter writes it mid-sync: pulls and a bundle in
    flight, one refused."""
    reporter = Reporter(
        line=RecordingLine(), store=JsonStateStore(state_dir),
        tally=PullTally(wall_clock=lambda: 1_790_000_000.0),
    )  # fmt: skip
    refs = tuple(f"r.test/app-{n}@sha256:{str(n) * 64}" for n in range(3))
    pending = SetStatus("apps", "/etc/x.yaml", True, "Progressing", 2, 1, None, None, 3, 0, 0,
                        bytes_to_pull=300 * MIB, pending=refs)  # fmt: skip
    reporter.sync_started()
    reporter.sync_progress(node_status([pending], runtime="cri-o 1.31", disk=None))
    reporter.pull_event(PullEvent(PullStep.STARTED, refs[0], 1))
    reporter.pull_event(PullEvent(PullStep.PULLED, refs[0], 1, seconds=3.0))
    progress = ByteProgress(312 * MIB, 1024 * MIB, 38.2e6, 19.5, 8.0)
    reporter.bundle_report(BundleReport(
        "/dev/sdb1", "storing", bundle_id="line-3", images_total=2,
        progress=progress.to_json(), progress_text=progress.describe(),
    ))  # fmt: skip
    reporter.bundle_report(BundleReport(
        "/dev/sdc1", "rejected", bundle_id="line-4", reason="BundleSignatureInvalid",
        message="the signature does not match",
    ))  # fmt: skip
    reporter.bundle_report(BundleReport(
        "/dev/sdd1", "pinned", bundle_id="olm-1", images_total=1, images_present=1,
        frozen_tags=(("r.test/catalog:v4.16", f"sha256:{'c' * 64}"),),
    ))  # fmt: skip
    reporter.save()


def test_status_mid_sync(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reported_status(tmp_path / "var/lib/nodeagent")
    capsys.readouterr()  # the reporter's journal lines
    code, text = run_json(capsys, tmp_path, "status")
    doc = schemas.check("status", text)
    assert code == 0 and doc["pulls"]["images"] == {
        "total": 3, "done": 1, "failed": 0, "inProgress": 0,
    }  # fmt: skip
    assert doc["pulls"]["bytes"] == {"total": 300 * MIB, "done": None}  # not sized
    assert doc["pulls"]["startedAt"] == "2026-09-21T14:13:20+00:00"
    assert doc["bundles"][0]["progress"]["elapsedSeconds"] == 8.0
    frozen = [b.get("frozenTags") for b in doc["bundles"]]
    assert {"r.test/catalog:v4.16": f"sha256:{'c' * 64}"} in frozen


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, Signed, Keys]:
    root = tmp_path / "root"
    keys = Keys.make(tmp_path / "trusted")
    app = image("example/alpha", [(MIB, 1)], tmp_path / "cache")
    bundle = signed_bundle(tmp_path / "alpha", keys, [app], bundle_id="alpha", set_name="s")
    bundle = with_served_tags(bundle, keys, {f"{HOST}/example/alpha:v1": app.digest})
    copy_bundle(root / "var/lib/nodeagent/store", bundle.root, bundle.manifest, keys.trusted_dir)
    return root, bundle, keys


def test_store_and_store_verify(
    stored: tuple[Path, Signed, Keys], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _bundle, _keys = stored
    code, text = run_json(capsys, root, "store")
    doc = schemas.check("store", text)
    assert code == 0 and doc["bundles"][0]["bundleId"] == "alpha"
    assert doc["bundles"][0]["frozenTags"] == {f"{HOST}/example/alpha:v1": _bundle.images[0].digest}
    code, text = run_json(capsys, root, "store", "verify")
    assert code == 0 and schemas.check("store-verify", text)["ok"] is True


def test_bundle_verify_authentic_and_refused(
    stored: tuple[Path, Signed, Keys], capsys: pytest.CaptureFixture[str]
) -> None:
    root, bundle, keys = stored
    argv = ("bundle", "verify", str(bundle.root), "--trusted-keys", str(keys.trusted_dir))
    code, text = run_json(capsys, root, *argv)
    doc = schemas.check("bundle-verify", text)
    assert (code, doc["ok"], doc["bundleId"], doc["error"]) == (0, True, "alpha", None)
    blob = next(iter(bundle.manifest.blobs))
    path = bundle.blob_file(blob)
    path.write_bytes(b"x" + path.read_bytes()[1:])
    code, text = run_json(capsys, root, *argv)
    doc = schemas.check("bundle-verify", text)
    assert code == 65 and doc["ok"] is False and doc["error"]["reason"] == "BundleDigestMismatch"


def test_site_status_and_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def read() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        return [node("a"), node("b")], [status("a", "pinned"), status("b", "pinned")]

    monkeypatch.setattr(cli_site, "_api", lambda _config, _args: ScriptedApi([read]))
    code, text = run_json(capsys, tmp_path, "site", "status")
    doc = schemas.check("site-status", text)
    assert code == 0 and doc["bundles"][0]["bundleId"] == BUNDLE
    code, text = run_json(capsys, tmp_path, "site", "wait", "--bundle", BUNDLE)
    assert code == 0 and schemas.check("site-wait", text)["complete"] is True


def test_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_json(capsys, tmp_path, "completion", "bash")
    assert (
        code == 0
        and "complete -F _nodeagent nodeagent" in schemas.check("completion", text)["script"]
    )


def test_a_status_file_cannot_forge_the_schema_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "var/lib/nodeagent"
    state.mkdir(parents=True)
    (state / "status.json").write_text(json.dumps({"schema": "evil/v9", "conditions": [],
                                                   "pinnedImageSets": []}))  # fmt: skip
    code, text = run_json(capsys, tmp_path, "status")
    assert code == 0 and schemas.check("status", text)["schema"] == "nodeagent.status/v1"
    assert re.match(r'\{\n  "schema": "nodeagent\.status/v1"', text)


def test_without_json_nothing_is_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reported_status(tmp_path / "var/lib/nodeagent")
    capsys.readouterr()
    assert cli.main(["status", "--root", str(tmp_path)]) == 0
    assert not capsys.readouterr().out.startswith("{")
