"""Re-rooting: host paths as seen under another root directory.

``root`` re-roots every host path (tests run against a fake root, as fwupd
does): ``/etc/crio`` becomes ``<root>/etc/crio``, the socket in a ``unix://``
endpoint included. Paths in the files are always written as on the host.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

UNIX_PREFIX = "unix://"
"""The scheme of a CRI endpoint that names a socket path."""

_Sections = TypeVar("_Sections", bound="DataclassInstance")


def reroot(path: Path, root: Path | None) -> Path:
    """``path`` as seen under ``root``: ``/etc/x`` → ``<root>/etc/x``; unchanged without a root."""
    if root is None:
        return path
    return root / path.relative_to("/") if path.is_absolute() else root / path


def reroot_sections(config: _Sections, root: Path | None) -> _Sections:
    """``config`` with every host path of its sections (its dataclass fields) under ``root``."""
    if root is None:
        return config
    sections = {
        item.name: _reroot_section(value, root)
        for item in dataclasses.fields(config)
        if dataclasses.is_dataclass(value := getattr(config, item.name))
    }
    return dataclasses.replace(config, **sections)


def _reroot_section(section: Any, root: Path) -> Any:
    changes: dict[str, object] = {}
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        if isinstance(value, Path):
            changes[item.name] = reroot(value, root)
        elif isinstance(value, tuple) and all(isinstance(p, Path) for p in value):
            changes[item.name] = tuple(reroot(p, root) for p in value)
        elif isinstance(value, str) and item.name == "endpoint" and value.startswith(UNIX_PREFIX):
            socket = Path(value.removeprefix(UNIX_PREFIX))
            changes[item.name] = UNIX_PREFIX + str(reroot(socket, root))
    return dataclasses.replace(section, **changes)
