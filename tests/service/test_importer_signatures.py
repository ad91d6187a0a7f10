"""The importer with a bundle that carries image signatures (docs/bundle-format.md, "Image
signatures"): served with its tags, the runtime told to read them from the mirror for the
session only, and a registries.d that would leave them unread reported as warnings.

Real: the importer, the manifest parser, ``bundles.signatures``. Fake: as in
test_importer.py (its ``Rig``), plus registries.d.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from nodeagent.bundles.import_ports import ImporterPorts
from nodeagent.bundles.importer import Importer
from nodeagent.bundles.manifest import BundleManifest, ExpectedFile, parse_manifest
from nodeagent.bundles.signatures import AttachmentScopes, parse_registries_d, signature_tag
from nodeagent.disk import DiskPolicy
from nodeagent.errors import HostFileError
from nodeagent.status import BundleReport
from tests.fakes.ports import FakeServer, FakeVerified
from tests.service.test_importer import APP, BUNDLE_ID, DB, GIB, TOTAL, Rig, manifest

SIG = "sha256:" + "6" * 64


def signed_manifest() -> BundleManifest:
    """``test_importer.manifest()`` with APP signed (its signature manifest a listed blob)."""
    doc: dict[str, Any] = json.loads(json.dumps(_doc(manifest())))
    doc["formatVersion"], doc["sequence"] = 3, 1
    doc["blobs"].append({"digest": SIG, "sizeBytes": 600})
    tag = signature_tag(APP.rpartition("@")[2])
    doc["imageSignatures"] = [{"image": APP, "tag": tag, "manifest": SIG}]
    return parse_manifest(json.dumps(doc).encode())


def _doc(parsed: BundleManifest) -> dict[str, Any]:
    """The document ``test_importer.manifest`` parsed, rebuilt from its values."""
    return {
        "formatVersion": 1, "bundleId": parsed.bundle_id, "created": parsed.created,
        "architecture": parsed.architecture, "layout": parsed.layout,
        "images": [{"name": str(i.ref), "manifestDigest": i.manifest_digest,
                    "sizeBytes": i.size_bytes} for i in parsed.images],
        "blobs": [{"digest": d, "sizeBytes": f.size_bytes} for d, f in parsed.blobs.items()],
        "files": [{"path": f.path, "sha256": f.sha256_hex, "sizeBytes": f.size_bytes}
                  for f in parsed.files if f.path == "oci-layout"],
        "pinnedImageSets": [{"persistent": s.is_persistent, "object": s.object}
                            for s in parsed.sets],
    }  # fmt: skip


class RegistriesD:
    directory = "/etc/containers/registries.d"

    def __init__(
        self, files: list[tuple[str, bytes]], *, is_readable: bool = True, is_writable: bool = True
    ) -> None:
        self.files, self.is_readable, self.is_writable = files, is_readable, is_writable
        self.events: list[str] = []

    def scopes(self) -> AttachmentScopes:
        if not self.is_readable:
            raise HostFileError(f"cannot list {self.directory}: Permission denied")
        return parse_registries_d(self.files)

    def write_mirror(self, mirror_host: str) -> bool:
        if not self.is_writable:
            raise HostFileError(f"cannot write {self.directory}: Read-only file system")
        self.events.append(f"write {mirror_host}")
        return True

    def remove_mirror(self) -> bool:
        self.events.append("remove")
        return True


class SignedRig:
    def __init__(self, registries_d: RegistriesD) -> None:
        self.rig = Rig()
        self.registries_d = registries_d
        self.tags: list[Mapping[str, str]] = []
        ports: ImporterPorts = replace(
            self.rig.importer.ports,
            verify=lambda _root: FakeVerified(signed_manifest(), signed_by="factory-2026"),
            make_signed_server=self._make_signed,
            sigstore=registries_d,
        )
        self.importer = Importer(ports, DiskPolicy(expansion_factor=2.0, reserve_bytes=GIB))

    def _make_signed(
        self, root: Path, blobs: Mapping[str, ExpectedFile], tags: Mapping[str, str]
    ) -> FakeServer:
        self.tags.append(dict(tags))
        server = FakeServer(root, blobs, bytes_served=TOTAL)
        self.rig.servers.append(server)
        return server

    async def run(self) -> BundleReport:
        return await self.importer.import_bundle(Path("/media"), source="/dev/sdb1")


COVERED = b"docker:\n  quay.io/acme:\n    use-sigstore-attachments: true\n"


async def test_a_signed_bundle_is_served_with_its_tags_and_the_mirror_drop_in() -> None:
    signed = SignedRig(RegistriesD([("quay.yaml", COVERED)]))

    report = await signed.run()

    assert report.state == "imported"
    assert signed.tags == [{f"acme/app/{signature_tag(APP.rpartition('@')[2])}": SIG}]
    assert SIG in signed.rig.servers[0].blobs
    assert signed.registries_d.events == ["write 127.0.0.1:5999", "remove"]
    assert sorted(signed.rig.crio.pull_calls) == [APP, DB]
    assert report.warnings == ()
    assert report.bundle_id == BUNDLE_ID


async def test_signatures_registries_d_leaves_unread_are_warnings_and_the_import_goes_on() -> None:
    signed = SignedRig(RegistriesD([]))

    report = await signed.run()

    assert report.state == "imported"
    assert [reason for reason, _ in report.warnings] == ["SigstoreAttachmentsOff"]
    assert APP in report.warnings[0][1]
    assert report.to_json()["warnings"][0]["reason"] == "SigstoreAttachmentsOff"


async def test_an_unreadable_registries_d_is_a_warning_too() -> None:
    signed = SignedRig(RegistriesD([], is_readable=False))

    report = await signed.run()

    assert report.state == "imported"
    reasons = [reason for reason, _ in report.warnings]
    assert reasons == ["RegistriesDInvalid", "SigstoreAttachmentsOff"]
    assert "Permission denied" in report.warnings[0][1]


async def test_an_unsigned_bundle_never_touches_registries_d() -> None:
    rig = Rig()
    registries_d = RegistriesD([])
    ports = replace(rig.importer.ports, sigstore=registries_d, make_signed_server=None)
    report = await Importer(
        ports, DiskPolicy(expansion_factor=2.0, reserve_bytes=GIB)
    ).import_bundle(Path("/run/nodeagent/media/NODEAGENT-1234"), source="/dev/sdb1")
    assert report.state == "imported"
    assert registries_d.events == []
    assert report.warnings == ()


async def test_a_registries_d_nodeagent_cannot_write_is_logged_and_the_import_goes_on() -> None:
    """The runtime then decides (a policy that needs the signatures refuses the images)."""
    signed = SignedRig(RegistriesD([("quay.yaml", COVERED)], is_writable=False))

    with capture_logs() as logs:
        report = await signed.run()

    assert report.state == "imported"
    assert signed.registries_d.events == ["remove"]
    [event] = [e for e in logs if e["event"] == "mirror_signatures_not_enabled"]
    assert (event["reason"], event["log_level"]) == ("HostFileError", "warning")
