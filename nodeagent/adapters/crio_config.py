"""CRI-O's configuration files as nodeagent's pins need them (implements ``pins.DropinStore``).

nodeagent's drop-in is written to the transient directory (``/run/crio/crio.conf.d``
by default, gone at reboot) and CRI-O reads it through a symlink of the same
name in its config directory. The link must never dangle, because a dangling
entry makes CRI-O's whole configuration load fail: the target is always
written before the link is made, and at boot the package's tmpfiles.d entry
and ``nodeagent render-pins --write`` recreate the target before CRI-O starts
(docs/pins.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from nodeagent.adapters.files import (
    ensure_symlink,
    list_files,
    read_text_or_none,
    remove_file,
    write_atomic,
)
from nodeagent.pins import MAX_RUNTIME_CONFIG_BYTES, ConfigFile
from nodeagent.strict import MalformedInput, loads_toml

DEFAULT_STAGING_DIR = "/var/tmp"  # noqa: S108  containers/image's default for big files
"""Where containers/image stages blobs when ``big_files_temporary_dir`` is not set."""


def staging_dir_of(files: Sequence[ConfigFile]) -> str | None:
    """``[crio.image] big_files_temporary_dir`` of the last file setting it to an absolute
    path; files that are not TOML are skipped (CRI-O fails on them anyway)."""
    return image_path_of(files, "big_files_temporary_dir")


def image_path_of(files: Sequence[ConfigFile], key: str) -> str | None:
    """``[crio.image] <key>`` of the last file setting it to an absolute path; files that
    are not TOML are skipped (CRI-O fails on them anyway)."""
    found: str | None = None
    for file in files:
        try:
            doc = loads_toml(file.text, what=file.path, max_bytes=MAX_RUNTIME_CONFIG_BYTES)
            image = doc.get("crio", {}).get("image", {})
        except (MalformedInput, AttributeError):
            continue
        value = image.get(key) if isinstance(image, dict) else None
        if isinstance(value, str) and _is_usable_dir(value):
            found = value
    return found


def _is_usable_dir(value: str) -> bool:
    """An absolute path the kernel can take (CRI-O would fail on any other, nodeagent skips it)."""
    return value.startswith("/") and "\0" not in value and len(value) <= 4096


def read_config_file(path: Path, *, is_after_ours: bool) -> ConfigFile | None:
    """One CRI-O config file, read within ``MAX_RUNTIME_CONFIG_BYTES``; None when absent.

    A file CRI-O would fail on (unreadable, a dangling link, too big, not UTF-8) comes back
    with ``error`` set: ``pins.foreign_pins`` reports it and keeps its last good pins.
    """
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_RUNTIME_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if not path.is_symlink():
            return None  # removed since it was listed (or the main file is absent)
        return ConfigFile(str(path), "", is_after_ours, error="a dangling link")
    except OSError as err:
        return ConfigFile(str(path), "", is_after_ours, error=f"cannot be read: {err.strerror}")
    if len(data) > MAX_RUNTIME_CONFIG_BYTES:
        error = f"is more than the {MAX_RUNTIME_CONFIG_BYTES} bytes nodeagent reads"
        return ConfigFile(str(path), "", is_after_ours, error=error)
    try:
        return ConfigFile(str(path), data.decode("utf-8"), is_after_ours)
    except UnicodeDecodeError as err:
        return ConfigFile(str(path), "", is_after_ours, error=f"is not UTF-8 ({err.reason})")


def _walk_key(root: Path, path: Path) -> tuple[bytes, ...]:
    return tuple(os.fsencode(part) for part in path.relative_to(root).parts)


class CrioDropins:
    """Reads CRI-O's main config and drop-ins; writes nodeagent's drop-in and its link."""

    def __init__(self, config_file: Path, config_dir: Path, transient_dir: Path, name: str) -> None:
        self.config_file = config_file
        self.config_dir = config_dir
        self.link = config_dir / name
        self.target = transient_dir / name

    def read_other_configs(self) -> list[ConfigFile]:
        """The main config, then every other drop-in in the order CRI-O reads them."""
        files: list[ConfigFile] = []
        main = read_config_file(self.config_file, is_after_ours=False)
        if main is not None:
            files.append(main)
        ours = _walk_key(self.config_dir, self.link)
        for path in list_files(self.config_dir, recursive=True):
            if path == self.link:
                continue
            is_after = _walk_key(self.config_dir, path) > ours
            dropin = read_config_file(path, is_after_ours=is_after)
            if dropin is not None:
                files.append(dropin)
        return files

    def staging_dirs(self) -> list[Path]:
        """Where CRI-O's pulls stage blobs: ``[crio.image] big_files_temporary_dir`` of the
        last file that sets it (CRI-O's reading order), else containers/image's /var/tmp."""
        return [Path(staging_dir_of(self.read_other_configs()) or DEFAULT_STAGING_DIR)]

    def global_auth_file(self) -> Path | None:
        """``[crio.image] global_auth_file`` of the last file that sets it (CRI-O's own
        credentials for pulls and for mirrors), None when no file does."""
        found = image_path_of(self.read_other_configs(), "global_auth_file")
        return Path(found) if found else None

    def read_dropin(self) -> str | None:
        return read_text_or_none(self.target)

    def write_dropin(self, text: str) -> bool:
        """Write the transient drop-in, then make sure the link points at it."""
        is_changed = write_atomic(self.target, text.encode())
        is_linked = ensure_symlink(self.link, self.target)
        return is_changed or is_linked

    def remove_dropin(self) -> None:
        """Remove the link first, then the target, so the link never dangles."""
        remove_file(self.link)
        remove_file(self.target)
