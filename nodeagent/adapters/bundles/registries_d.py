"""containers-registries.d(5) on the host: read what it says of sigstore attachments, and
nodeagent's one drop-in that makes the runtime read them from the loopback mirror.

The directory is ``[runtime] registries_d_dir``; containers/image reads every ``*.yaml``
file directly inside it (not recursively) and refuses the whole directory when a file is
malformed or two files set the same scope. Each file is read up to
``MAX_REGISTRIES_D_FILE_BYTES`` (plus one byte, to tell a longer file); the parsing and
the rules are ``nodeagent.bundles.signatures``'. The drop-in is written atomically
(``adapters.files.write_atomic``) and removed after the import; the runtime reads the
directory at every pull, so no reload is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from nodeagent.adapters.files import remove_file, write_atomic
from nodeagent.bundles.signatures import (
    MAX_REGISTRIES_D_FILE_BYTES,
    MAX_REGISTRIES_D_FILES,
    AttachmentScopes,
    mirror_attachments_dropin,
    parse_registries_d,
)
from nodeagent.errors import ConfigInvalid, HostFileError

DROPIN_NAME: Final = "99-nodeagent-bundle-mirror.yaml"


class RegistriesD:
    """The runtime's registries.d directory and nodeagent's drop-in ``dropin_name`` in it."""

    def __init__(self, directory: Path, dropin_name: str = DROPIN_NAME) -> None:
        if not dropin_name.endswith(".yaml") or "/" in dropin_name:
            raise ConfigInvalid(f"registries.d drop-in {dropin_name!r} must be a NAME.yaml")
        self.path = directory
        self.dropin = directory / dropin_name

    @property
    def directory(self) -> str:
        return str(self.path)

    def scopes(self) -> AttachmentScopes:
        """The directory's files (nodeagent's own drop-in left out), parsed; none when the
        directory does not exist (containers/image then uses no configuration either)."""
        return parse_registries_d(self._files())

    def _files(self) -> list[tuple[str, bytes]]:
        try:
            names = sorted(entry.name for entry in self.path.iterdir())
        except FileNotFoundError:
            return []
        except OSError as err:
            raise HostFileError(f"cannot list {self.path}: {err.strerror}") from err
        chosen = [n for n in names if n.endswith(".yaml") and n != self.dropin.name]
        return [(name, self._read(name)) for name in chosen[: MAX_REGISTRIES_D_FILES + 1]]

    def _read(self, name: str) -> bytes:
        try:
            with (self.path / name).open("rb") as stream:
                return stream.read(MAX_REGISTRIES_D_FILE_BYTES + 1)
        except OSError as err:
            raise HostFileError(f"cannot read {self.path / name}: {err.strerror}") from err

    def write_mirror(self, mirror_host: str) -> bool:
        """Make the runtime read sigstore attachments from ``mirror_host``; False when another
        file sets that scope already (writing it again would make the directory invalid)."""
        if mirror_host in self.scopes().namespaces:
            return False
        write_atomic(self.dropin, mirror_attachments_dropin(mirror_host).encode())
        return True

    def remove_mirror(self) -> bool:
        """Remove the drop-in; return False if it was already gone."""
        return remove_file(self.dropin)
