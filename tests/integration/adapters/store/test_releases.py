"""The one reader of the store's release bundles (``adapters.store.releases``), which serves
both the status (``releases.release_reports``) and retirement, on a real store filled by
the real copier from signed release bundles.

Proves: every release bundle is listed with its version, digest, set and ``previous``; a
plain bundle is not; whether its set is pinned follows the spec directory at each call; the
manifests are parsed once and again only when a bundle comes or goes; unpinning removes the
set file and leaves the signed manifest; the status reports judge the same releases against
the cluster's version.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.store import releases as releases_module
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.releases import StoredReleases
from nodeagent.bundles.handover import set_file_name
from nodeagent.releases import release_reports
from nodeagent.store.layout import MANIFEST_NAME, bundle_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle, with_release


def _bundle(work: Path, keys: Keys, n: int, version: str | None) -> Signed:
    bundle_id = f"release-{version}" if version else f"plain-{n}"
    built = [image(f"ocp/release-{n}", [(4096, 700 + n)], work / "cache")]
    signed = signed_bundle(
        work / bundle_id, keys, built, bundle_id=bundle_id, set_name=bundle_id, sequence=n + 1
    )
    if version is None:
        return signed
    return with_release(signed, keys, [b"sig"], version=version, previous=["4.16.2", "4.16.3"])


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, Path, dict[str, Signed]]:
    keys = Keys.make(tmp_path / "keys")
    root, specs = tmp_path / "store", tmp_path / "specs"
    specs.mkdir()
    bundles = {}
    for n, version in enumerate(["4.17.1", None]):
        signed = _bundle(tmp_path, keys, n, version)
        copy_bundle(root, signed.root, signed.manifest, keys.trusted_dir)
        bundles[signed.manifest.bundle_id] = signed
        (specs / set_file_name(signed.manifest.bundle_id, signed.manifest.bundle_id)).touch()
    return root, specs, bundles


def test_one_reader_lists_the_release_bundles_and_follows_the_spec_directory(
    store: tuple[Path, Path, dict[str, Signed]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, specs, bundles = store
    parsed: list[int] = []
    real_parse = releases_module.parse_manifest  # type: ignore[attr-defined]

    def counting_parse(data: bytes) -> object:
        parsed.append(1)
        return real_parse(data)

    monkeypatch.setattr(releases_module, "parse_manifest", counting_parse)
    reader = StoredReleases(root, [specs])
    (held,) = reader.held()
    signed = bundles["release-4.17.1"]
    assert signed.manifest.release is not None
    assert (held.bundle_id, held.version, held.set_name) == (
        "release-4.17.1",
        "4.17.1",
        held.bundle_id,
    )
    assert held.digest == signed.manifest.release.image.digest
    assert held.previous == ("4.16.2", "4.16.3")
    assert held.is_pinned
    after_first = len(parsed)
    assert after_first == 2  # both bundles' manifests, once

    (specs / set_file_name(held.bundle_id, held.set_name)).unlink()
    assert [h.is_pinned for h in reader.held()] == [False]
    assert len(parsed) == after_first  # the spec directory is read, the manifests are not

    (report,) = release_reports(reader.held(), "4.16.3")
    assert (report.version, report.is_upgrade, report.path_reason) == ("4.17.1", True, "")
    (report,) = release_reports(reader.held(), "4.15.0")
    assert (report.is_upgrade, report.path_reason) == (False, "ReleaseNotAnUpgrade")

    manifest = root / bundle_dir("release-4.17.1") / MANIFEST_NAME
    kept = manifest.read_bytes()
    manifest.unlink()  # the bundle's manifest went away: read again, the release is gone
    assert reader.held() == ()
    assert len(parsed) == after_first + 1
    manifest.write_bytes(kept)
    assert [h.version for h in reader.held()] == ["4.17.1"]


def test_unpin_removes_the_set_file_and_keeps_the_signed_manifest(
    store: tuple[Path, Path, dict[str, Signed]],
) -> None:
    root, specs, _ = store
    reader = StoredReleases(root, [specs])
    (held,) = reader.held()
    assert reader.unpin(held) == [specs / set_file_name(held.bundle_id, held.set_name)]
    assert reader.unpin(held) == []
    assert (root / bundle_dir(held.bundle_id) / MANIFEST_NAME).is_file()
    assert [h.is_pinned for h in reader.held()] == [False]
