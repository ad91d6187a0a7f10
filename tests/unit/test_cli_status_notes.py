"""``nodeagent status`` prints the bundles seen and the last image loss (status file in,
escaped text out)."""

from __future__ import annotations

import pytest

from nodeagent.cli.status_view import print_status


def test_bundles_with_progress_and_a_loss_are_printed_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = {
        "updatedAt": "2026-11-25T10:00:00+00:00",
        "conditions": [],
        "pinnedImageSets": [],
        "images": {"pinned": 2, "total": 3, "failed": 0},
        "bundles": [
            {
                "source": "/dev/sdb1",
                "bundleId": "line-3\x1b[2J",
                "state": "stored",
                "images": {"total": 3, "present": 0},
                "mediumRemovable": True,
            },
            {
                "source": "/dev/sdc1",
                "bundleId": "line-4",
                "state": "storing",
                "images": {"total": 3, "present": 0},
                "progress": {"doneBytes": 1, "totalBytes": 2, "text": "1 B of 2 B (50 %)"},
            },
        ],
        "imageLoss": {
            "reason": "RuntimeStorageWiped",
            "at": "2026-11-25T09:59:00+00:00",
            "message": "all 3 pinned images are gone",
            "restoredFromStore": 3,
        },
    }
    print_status(doc)
    out = capsys.readouterr().out.splitlines()
    assert "bundle line-3\\x1b[2J: stored, images 0/3, the medium may be removed" in out
    assert "bundle line-4: storing, images 0/3: 1 B of 2 B (50 %)" in out
    assert (
        "images lost at 2026-11-25T09:59:00+00:00: RuntimeStorageWiped: "
        "all 3 pinned images are gone" in out
    )
    assert "restored 3 images from the local store" in out


def test_a_bundles_warnings_are_printed_under_it(capsys: pytest.CaptureFixture[str]) -> None:
    doc = {
        "updatedAt": "2026-11-25T10:00:00+00:00",
        "conditions": [],
        "pinnedImageSets": [],
        "images": {"pinned": 1, "total": 1, "failed": 0},
        "bundles": [
            {
                "source": "/dev/sdb1",
                "bundleId": "line-3",
                "state": "pinned",
                "images": {"total": 1, "present": 1},
                "warnings": [{"reason": "SigstoreAttachmentsOff", "message": "add\x1b[2J it"}],
            }
        ],
    }
    print_status(doc)
    out = capsys.readouterr().out.splitlines()
    assert out[out.index("bundle line-3: pinned, images 1/1") + 1] == (
        "  warning SigstoreAttachmentsOff: add\\x1b[2J it"
    )


def test_a_bundles_frozen_tags_are_printed_under_it(capsys: pytest.CaptureFixture[str]) -> None:
    digest = f"sha256:{'c' * 64}"
    doc = {
        "updatedAt": "2026-11-25T10:00:00+00:00",
        "conditions": [],
        "pinnedImageSets": [],
        "images": {"pinned": 1, "total": 1, "failed": 0},
        "bundles": [
            {
                "source": "/dev/sdb1",
                "bundleId": "olm-1",
                "state": "pinned",
                "images": {"total": 1, "present": 1},
                "frozenTags": {"quay.io/olm/catalog:v4.16\x1b[2J": digest},
            }
        ],
    }
    print_status(doc)
    out = capsys.readouterr().out.splitlines()
    assert out[out.index("bundle olm-1: pinned, images 1/1") + 1] == (
        f"  frozen tag quay.io/olm/catalog:v4.16\\x1b[2J -> {digest} (served as signed, even if "
        "the registry moves it)"
    )


def test_the_os_image_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    digest = "sha256:" + "1" * 64
    doc = {
        "conditions": [],
        "osImage": {
            "id": "rhcos",
            "versionId": "4.18",
            "version": "418.94\x1b[2J",
            "booted": {"source": "rpm-ostree", "image": f"q.io/os@{digest}", "digest": digest},
        },
    }
    print_status(doc)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"os: rhcos 4.18 (418.94\\x1b[2J), booted q.io/os@{digest} (rpm-ostree)"


def test_a_version_that_starts_with_its_version_id_is_printed_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = {
        "conditions": [],
        "osImage": {"id": "debian", "versionId": "12", "version": "12 (bookworm)"},
    }
    print_status(doc)
    assert capsys.readouterr().out.splitlines()[1] == "os: debian 12 (bookworm)"
