"""Small host look-ups for the daemon: boot id, free space, pull staging files, auth and
registries files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from nodeagent.adapters.files import list_files, read_text_or_none, statvfs_free
from nodeagent.adapters.registry.mirrors import Route, routes_from
from nodeagent.authfile import AuthStore, parse_auth_file
from nodeagent.errors import ConfigInvalid, HostFileError
from nodeagent.ports import FilesystemSpace, RegistryCredentials
from nodeagent.registries import insecure_locations, read_registries_conf

log = structlog.get_logger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """The kernel's id of this boot; transient state is tied to it."""
    text = read_text_or_none(path)
    return text.strip() if text else "unknown-boot"


class StatvfsSpace:
    """``sync.SpaceProbe``: statvfs of the image filesystem."""

    def space(self, mountpoint: str) -> FilesystemSpace:
        figures = statvfs_free(Path(mountpoint))
        return FilesystemSpace(mountpoint, figures.total_bytes, figures.available_bytes)


STAGING_PREFIX = "container_images_"
"""containers/image names its temporary files and directories for blobs so (its
``internal/tmpdir``): a pull through CRI-O stages each blob it fetches in
``<big_files_temporary_dir>/container_images_storage<random>/<n>`` (docs/runtime-facts.md)."""


class StagingProbe:
    """``prepull.ProgressProbe``: the names and sizes of the runtime's staging files.

    Only pulls write there, so journald, pod logs or anything else busy on the same
    filesystem never look like progress (docs/decisions/0005-stall-signal.md). ``dirs``
    gives the staging directories (CRI-O's ``big_files_temporary_dir``, read again each
    time); one missing counts as empty.
    """

    def __init__(self, dirs: Callable[[], Iterable[Path]]) -> None:
        self._dirs = dirs

    def progress_mark(self) -> int:
        entries: list[tuple[str, int]] = []
        for base in self._dirs():
            try:
                entries.extend(_staged(base))
            except FileNotFoundError:
                continue
            except OSError as err:
                raise HostFileError(f"cannot list staging files in {base}: {err.strerror}") from err
        return hash(tuple(sorted(entries)))


def _staged(base: Path) -> list[tuple[str, int]]:
    """(name, size) of every staging file under ``base``; a staging directory counts too."""
    found: list[tuple[str, int]] = []
    with os.scandir(base) as top:
        staging = [entry for entry in top if entry.name.startswith(STAGING_PREFIX)]
    for entry in staging:
        try:
            if not entry.is_dir(follow_symlinks=False):
                found.append((entry.name, entry.stat(follow_symlinks=False).st_size))
                continue
            found.append((entry.name, -1))
            with os.scandir(entry.path) as inner:
                found.extend(
                    (f"{entry.name}/{f.name}", f.stat(follow_symlinks=False).st_size) for f in inner
                )
        except FileNotFoundError:  # the pull ended while we looked: that is a change too
            found.append((entry.name, -2))
    return found


class AuthFile:
    """The registry auth file, re-read when it changes (kubelet rotates pull secrets)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._store = AuthStore.empty(str(path))

    def _current(self) -> AuthStore:
        try:
            info = self.path.stat()
        except OSError:
            self._stamp, self._store = None, AuthStore.empty(str(self.path))
            return self._store
        stamp = (info.st_mtime_ns, info.st_ino)
        if stamp != self._stamp:
            text = read_text_or_none(self.path) or "{}"
            self._store = parse_auth_file(text, source=str(self.path))
            self._stamp = stamp
        return self._store

    def credentials_for(self, ref: str) -> RegistryCredentials | None:
        return self._current().credentials_for(ref)


class RuntimeAuthFile:
    """The auth file CRI-O's configuration names (``global_auth_file``), looked up again at
    ``refresh`` (each sync): what CRI-O itself uses where nodeagent's own file has no entry."""

    def __init__(self, locate: Callable[[], Path | None]) -> None:
        self._locate = locate
        self._file: AuthFile | None = None

    def refresh(self) -> None:
        path = self._locate()
        if path is None:
            self._file = None
        elif self._file is None or self._file.path != path:
            self._file = AuthFile(path)

    def credentials_for(self, ref: str) -> RegistryCredentials | None:
        return self._file.credentials_for(ref) if self._file is not None else None


def first_credentials(
    *sources: Callable[[str], RegistryCredentials | None],
) -> Callable[[str], RegistryCredentials | None]:
    """Credentials for a reference from the first source that has an entry for it."""

    def credentials_for(ref: str) -> RegistryCredentials | None:
        for source in sources:
            found = source(ref)
            if found is not None:
                return found
        return None

    return credentials_for


class InsecureRegistries:
    """registries.conf's insecure locations, read again when one of its files changed (as
    CRI-O reads them again at its reload), so a mirror marked insecure later is reached
    over plain HTTP for disk admission too, without restarting nodeagent. ``routes`` gives
    its mirrors (``adapters.registry.mirrors``), read again the same way.

    The first read raises ``ConfigInvalid`` (``HostFileError`` for a file that is not UTF-8)
    for a broken file; a later broken edit keeps the locations and routes read last (CRI-O
    keeps its own until its reload fails too) and logs it once.
    """

    def __init__(self, conf: Path, dropin_dir: Path) -> None:
        self.conf = conf
        self.dropin_dir = dropin_dir
        self._stamp = self._files_stamp()
        read = read_registries_conf(registries_texts(conf, dropin_dir))
        self._value, self._routes = insecure_locations(read), routes_from(read)

    def _files_stamp(self) -> tuple[tuple[str, int, int], ...]:
        paths = [self.conf, *list_files(self.dropin_dir, recursive=False)]
        stamps = []
        for path in paths:
            try:
                info = path.stat()
            except OSError:
                continue
            stamps.append((str(path), info.st_mtime_ns, info.st_ino))
        return tuple(stamps)

    def _refresh(self) -> None:
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            read = read_registries_conf(registries_texts(self.conf, self.dropin_dir))
        except (ConfigInvalid, HostFileError) as exc:  # keep what was read last, as CRI-O does
            log.warning("registries_conf_invalid", reason=exc.reason, error=exc.message)
            return
        self._value, self._routes = insecure_locations(read), routes_from(read)

    def __call__(self) -> frozenset[str]:
        self._refresh()
        return self._value

    def routes(self) -> tuple[Route, ...]:
        self._refresh()
        return self._routes


def registries_texts(conf: Path, dropin_dir: Path) -> list[tuple[str, str]]:
    """(name, text) of registries.conf, then its ``*.conf`` drop-ins in name order."""
    texts = [(str(conf), read_text_or_none(conf) or "")]
    texts += [
        (path.name, read_text_or_none(path) or "")
        for path in sorted(list_files(dropin_dir, recursive=False))
        if path.suffix == ".conf"
    ]
    return texts
