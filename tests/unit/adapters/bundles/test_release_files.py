"""Reading a release image's layers and signature files (``adapters.bundles.release``)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from nodeagent.adapters.bundles import release as adapter
from nodeagent.bundles import release
from nodeagent.errors import ReleaseImageInvalid
from nodeagent.references import parse_pinned_image_ref

REFS, META = release.RELEASE_FILES
REF = parse_pinned_image_ref(f"quay.io/ocp/release@sha256:{'a' * 64}")
DIGEST = REF.digest


def layer(path: Path, members: list[tuple[str, bytes | None]], *, is_gzip: bool = True) -> Path:
    """A tar layer; a member whose data is None is a symbolic link to ``/etc/passwd``."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue()) if is_gzip else raw.getvalue())
    return path


def test_both_files_are_read_and_an_upper_layer_hides_a_lower_one(tmp_path: Path) -> None:
    lower = layer(tmp_path / "1", [(f"./{REFS}", b"old"), (META, b"meta")])
    upper = layer(tmp_path / "2", [(f"/{REFS}", b"new"), ("other", b"x")], is_gzip=False)
    assert adapter.read_release_files([lower, upper], REF) == {REFS: b"new", META: b"meta"}


def test_links_and_escaping_names_are_not_the_release_files(tmp_path: Path) -> None:
    path = layer(tmp_path / "1", [(REFS, None), (f"../{META}", b"x"), (f"a/../{META}", b"y")])
    assert adapter.read_layer_files(path, release.RELEASE_FILES, "layer") == {}


def test_a_file_over_its_bound_is_refused(tmp_path: Path) -> None:
    path = layer(tmp_path / "1", [(REFS, b" " * (release.MAX_RELEASE_FILE_BYTES + 1))])
    with pytest.raises(ReleaseImageInvalid, match="more than"):
        adapter.read_layer_files(path, release.RELEASE_FILES, "layer")


def test_a_layer_that_decompresses_past_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adapter, "MAX_LAYER_READ_BYTES", 64 * 1024)
    path = layer(tmp_path / "1", [("big", b"\0" * (1 << 20)), (REFS, b"late")])
    with pytest.raises(ReleaseImageInvalid, match="decompresses to more than"):
        adapter.read_layer_files(path, release.RELEASE_FILES, "layer")


def test_a_broken_layer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "1"
    path.write_bytes(gzip.compress(b"not a tar")[:-8])
    with pytest.raises(ReleaseImageInvalid, match="not a readable tar layer"):
        adapter.read_layer_files(path, release.RELEASE_FILES, "layer")


def test_a_signature_store_is_read_in_order(tmp_path: Path) -> None:
    own = tmp_path / DIGEST.replace(":", "=")
    own.mkdir()
    for n in (2, 1):
        (own / f"signature-{n}").write_bytes(f"sig {n}".encode())
    (own / "signature-1.partial").write_bytes(b"ignored")
    assert adapter.read_signature_dir(tmp_path, DIGEST) == (b"sig 1", b"sig 2")


@pytest.mark.parametrize(
    ("names", "needle"),
    [((), "1 to 16"), (("signature-2",), "without a gap"), (("signature-1", "signature-3"), "gap")],
)
def test_a_signature_store_with_a_gap_or_nothing_is_refused(
    tmp_path: Path, names: tuple[str, ...], needle: str
) -> None:
    own = tmp_path / DIGEST.replace(":", "=")
    own.mkdir()
    for name in names:
        (own / name).write_bytes(b"sig")
    with pytest.raises(ReleaseImageInvalid, match=needle):
        adapter.read_signature_dir(tmp_path, DIGEST)


def test_signature_files_are_bounded(tmp_path: Path) -> None:
    empty, big = tmp_path / "empty", tmp_path / "big"
    empty.write_bytes(b"")
    big.write_bytes(b"x" * (release.MAX_SIGNATURE_BYTES + 1))
    for path in (empty, big, tmp_path / "missing"):
        with pytest.raises(ReleaseImageInvalid):
            adapter.read_signature_files([path], DIGEST)
