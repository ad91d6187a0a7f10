"""A stored signature manifest the disk fails to read is said, with a reason code: it was
taken for "not stored" in silence before (issue 30, "no error swallowed")."""

from __future__ import annotations

import errno
from typing import Any, cast

from structlog.testing import capture_logs

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.node_store import _is_stored
from nodeagent.errors import StoreBlobCorrupt

DIGEST = "sha256:" + "a" * 64


class FailingBlobs:
    """A ``BlobStore`` whose reads fail the way the disk (or the digest) made them fail."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def open_verified(self, digest: str) -> Any:
        raise self.error


def test_a_read_error_of_the_disk_is_an_error_line_with_its_reason() -> None:
    blobs = cast("BlobStore", FailingBlobs(OSError(errno.EIO, "Input/output error")))
    with capture_logs() as logs:
        assert _is_stored(blobs, {DIGEST: 100}, DIGEST) is False
    assert [(e["event"], e["log_level"], e["reason"], e["error"]) for e in logs] == [
        ("signature_manifest_unreadable", "error", "StoreReadFailed", "Input/output error")
    ]


def test_a_damaged_manifest_is_a_warning_with_the_store_s_reason() -> None:
    blobs = cast("BlobStore", FailingBlobs(StoreBlobCorrupt("digest mismatch")))
    with capture_logs() as logs:
        assert _is_stored(blobs, {DIGEST: 100}, DIGEST) is False
    assert [(e["log_level"], e["reason"]) for e in logs] == [("warning", "StoreBlobCorrupt")]


def test_a_manifest_not_stored_is_no_news() -> None:
    blobs = cast("BlobStore", FailingBlobs(AssertionError("never opened")))
    with capture_logs() as logs:
        assert _is_stored(blobs, {}, DIGEST) is False
    assert logs == []
