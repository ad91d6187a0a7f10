"""Loading the configuration: a TOML main file plus ``config.d/*.toml`` drop-ins.

The drop-ins live in ``<directory of the main file>/config.d`` and apply in
lexical file-name order (names starting with ``.`` are skipped: editors' and
atomic writers' temporary files). A later file overrides single keys of an
earlier one: tables merge key by key, lists are replaced whole. A missing main
file means the built-in defaults. Every unknown key, wrong type or out-of-range
value is a ``ConfigInvalid`` naming the dotted key and the file that set it.

Each key's type comes from its field in ``nodeagent.config.settings``; the ranges
are the rules at the bottom (``BOUNDS``: every numeric key, stated in its field's
docstring). Files are read strictly (``strict.loads_toml``, at most 1 MiB, nesting 8),
strings hold at most 4096 characters, integers and sizes stay below 2^63, numbers are
finite; a refused value is shown clipped. Checks run on the paths as written, then
every host path is re-rooted (``nodeagent.config.rerooting``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import math
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodeagent.config.addresses import is_address, parse_address
from nodeagent.config.rerooting import UNIX_PREFIX, reroot, reroot_sections
from nodeagent.config.settings import (
    DROPIN_DIR_NAME,
    KNOWN_MEDIA_BUSES,
    KNOWN_MEDIA_FS_TYPES,
    Config,
)
from nodeagent.config.upgrade import MIN_KEEP_RELEASES, UPGRADE_START_MODES
from nodeagent.errors import ConfigInvalid
from nodeagent.selectors import parse_selector
from nodeagent.strict import MalformedInput, clip, loads_toml
from nodeagent.units import parse_size

LOG_LEVELS = ("debug", "info", "warning", "error")
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_CONFIG_FILE_BYTES = 1024 * 1024
"""A configuration file larger than this is refused unread; the packaged one is ~3 KiB."""
MAX_STRING_CHARS = 4096
"""Longest string value (PATH_MAX); longer ones are refused before any other check."""
MAX_INTEGER = 2**63 - 1
"""Largest integer (and size in bytes) of any key: what the kernel and CRI count in."""


def load_config(path: Path, *, root: Path | None = None) -> Config:
    """Load the main file ``path`` (a host path) and its ``config.d`` drop-ins, under ``root``."""
    source = reroot(path, root)
    layers: list[tuple[Path, _Layer]] = []
    main = _read_layer(source, is_missing_ok=True)
    if main is not None:
        layers.append((source, main))
    for dropin in _dropin_files(source.parent / DROPIN_DIR_NAME):
        layers.append((dropin, _read_layer(dropin, is_missing_ok=False) or {}))
    values, origins = _merge(layers)
    files = tuple(file for file, _ in layers)
    config = _assemble(values, source=source, files=files)
    _validate(config, origins)  # on the paths as written, before re-rooting
    return reroot_sections(config, root)


# ---------------------------------------------------------------- reading and merging

_Layer = dict[str, dict[str, object]]


def _read_layer(file: Path, *, is_missing_ok: bool) -> _Layer | None:
    try:
        with file.open("rb") as stream:
            data = stream.read(MAX_CONFIG_FILE_BYTES + 1)
    except FileNotFoundError:
        if is_missing_ok:
            return None
        raise ConfigInvalid(f"cannot read {file}: no such file (a dangling link?)") from None
    except OSError as exc:
        raise ConfigInvalid(f"cannot read {file}: {exc.strerror}") from exc
    try:
        raw = loads_toml(data, what=str(file), max_bytes=MAX_CONFIG_FILE_BYTES, max_depth=8)
    except MalformedInput as exc:
        raise ConfigInvalid(str(exc)) from None
    return _convert_layer(raw, file)


def _dropin_files(directory: Path) -> list[Path]:
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigInvalid(f"cannot list drop-in directory {directory}: {exc.strerror}") from exc
    names = sorted(p.name for p in entries if p.suffix == ".toml" and not p.name.startswith("."))
    return [directory / name for name in names if not (directory / name).is_dir()]


def _convert_layer(raw: Mapping[str, Any], file: Path) -> _Layer:
    layer: _Layer = {}
    for section, table in raw.items():
        schema = _SCHEMA.get(section)
        if schema is None:
            raise ConfigInvalid(_unknown_key_message(section, list(_SCHEMA), file))
        if not isinstance(table, dict):
            raise ConfigInvalid(
                f"{section} in {file} must be a table [{section}], got {_shown(table)}"
            )
        layer[section] = {
            key: _convert(f"{section}.{key}", value, schema, file) for key, value in table.items()
        }
    return layer


def _convert(dotted: str, value: object, schema: Mapping[str, _Converter], file: Path) -> object:
    section, _, key = dotted.partition(".")
    converter = schema.get(key)
    if converter is None:
        known = [f"{section}.{name}" for name in schema]
        raise ConfigInvalid(_unknown_key_message(dotted, known, file))
    try:
        return converter(value)
    except _WrongTypeError as exc:
        raise ConfigInvalid(
            f"{dotted} in {file} must be {exc.expected}, got {_shown(value)}"
        ) from None


def _shown(value: object) -> str:
    """A value from a file for a message: its repr, clipped and escaped (never 10 MB of it)."""
    if isinstance(value, dict | list):
        return f"a {'table' if isinstance(value, dict) else 'list'}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        return f"an integer of {len(str(abs(value)))} digits"
    return clip(repr(value), 120)


def _unknown_key_message(dotted: str, known: list[str], file: Path) -> str:
    import difflib  # noqa: PLC0415  only a broken config needs it

    shown = clip(dotted, 120)
    close = difflib.get_close_matches(dotted, known, n=1) if len(dotted) <= 120 else []
    hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
    return f"unknown key {shown} in {file}; {hint}"


def _merge(layers: list[tuple[Path, _Layer]]) -> tuple[_Layer, dict[str, Path]]:
    values: _Layer = {}
    origins: dict[str, Path] = {}
    for file, layer in layers:
        for section, table in layer.items():
            values.setdefault(section, {}).update(table)
            origins.update({f"{section}.{key}": file for key in table})
    return values, origins


def _assemble(values: _Layer, *, source: Path, files: tuple[Path, ...] = ()) -> Config:
    sections = {name: cls(**values.get(name, {})) for name, cls in _SECTIONS.items()}
    dropin_dir = source.parent / DROPIN_DIR_NAME
    return Config(**sections, source=source, dropin_dir=dropin_dir, files=files)


# ---------------------------------------------------------------- types

_Converter = Callable[[object], object]


class _WrongTypeError(Exception):
    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


def _as_bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _WrongTypeError("true or false")
    return value


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _WrongTypeError("an integer")
    if abs(value) > MAX_INTEGER:
        raise _WrongTypeError("an integer below 2^63")
    return value


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WrongTypeError("a number")
    if isinstance(value, int) and abs(value) > MAX_INTEGER:
        raise _WrongTypeError("a number below 2^63")
    if not math.isfinite(value):
        raise _WrongTypeError("a finite number")
    return float(value)


def _as_str(value: object) -> str:
    if not isinstance(value, str):
        raise _WrongTypeError("a string")
    if len(value) > MAX_STRING_CHARS:
        raise _WrongTypeError(f"a string of at most {MAX_STRING_CHARS} characters")
    return value


def _as_path(value: object, expected: str = "an absolute path") -> Path:
    if not isinstance(value, str) or not value.startswith("/"):
        raise _WrongTypeError(expected)
    if len(value) > MAX_STRING_CHARS or "\0" in value:
        raise _WrongTypeError(f"{expected} of at most {MAX_STRING_CHARS} characters, without NUL")
    return Path(value)


def _as_optional_path(value: object) -> Path | None:
    return None if value == "" else _as_path(value, 'an absolute path or ""')


def _as_paths(value: object) -> tuple[Path, ...]:
    expected = "a non-empty list of absolute paths"
    if not isinstance(value, list) or not value:
        raise _WrongTypeError(expected)
    return tuple(_as_path(item, expected) for item in value)


MAX_PEERS = 256
"""Longest ``[site] peers`` list."""


def _as_strings(value: object) -> tuple[str, ...]:
    expected = f"a list of at most {MAX_PEERS} strings"
    if not isinstance(value, list) or len(value) > MAX_PEERS:
        raise _WrongTypeError(expected)
    return tuple(_as_str(item) for item in value)


def _as_size(value: object) -> int:
    size: int | None = None
    if isinstance(value, str) and len(value) <= 64:
        with contextlib.suppress(ValueError):
            size = parse_size(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        size = value
    if size is None or abs(size) > MAX_INTEGER:
        raise _WrongTypeError('a number of bytes below 2^63 or a size such as "2GiB" or "500MB"')
    return size


_CONVERTERS: dict[object, _Converter] = {
    bool: _as_bool,
    int: _as_int,
    float: _as_float,
    str: _as_str,
    Path: _as_path,
    Path | None: _as_optional_path,
    tuple[Path, ...]: _as_paths,
    tuple[str, ...]: _as_strings,
}


def _schema_of(cls: type[Any]) -> dict[str, _Converter]:
    hints = typing.get_type_hints(cls)
    return {
        item.name: _as_size if item.name.endswith("_bytes") else _CONVERTERS[hints[item.name]]
        for item in dataclasses.fields(cls)
    }


_SECTIONS: dict[str, type[Any]] = {
    name: hint
    for name, hint in typing.get_type_hints(Config).items()
    if isinstance(hint, type) and dataclasses.is_dataclass(hint)
}
_SCHEMA = {name: _schema_of(cls) for name, cls in _SECTIONS.items()}


# ---------------------------------------------------------------- ranges


def _is_loopback_address(text: str, _: Config) -> bool:
    """``address:port`` on loopback (127.0.0.0/8 or ::1): the node mirror is plain HTTP."""
    try:
        return ipaddress.ip_address(parse_address(text).host).is_loopback
    except ValueError:
        return False


def _is_file_name(name: str, _: Config) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """The documented range of a numeric key; ``text`` is what its field docstring says."""

    low: float
    high: float
    is_low_open: bool = False
    unit: str = ""

    @property
    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        low, high = _number(self.low), _number(self.high)
        if self.is_low_open:
            return f"greater than {low} and at most {high}{unit}"
        return f"from {low} to {high}{unit}"

    def __call__(self, value: float, _: Config) -> bool:
        above = value > self.low if self.is_low_open else value >= self.low
        return above and value <= self.high


def _number(value: float) -> str:
    if value == MAX_INTEGER:
        return "2^63-1"
    return str(int(value)) if float(value).is_integer() else str(value)


_HOUR_S = 3600.0
_DAY_S = 86400.0
BOUNDS: dict[str, Bounds] = {
    "runtime.reload_timeout_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "runtime.call_timeout_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "pull.concurrency": Bounds(1, 64),
    "pull.attempts": Bounds(1, 1000),
    "pull.backoff_initial_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "pull.backoff_max_s": Bounds(0, _DAY_S, is_low_open=True, unit="seconds"),
    "pull.shared_layer_min_bytes": Bounds(0, MAX_INTEGER, unit="bytes"),
    "pull.stall_timeout_s": Bounds(0, _DAY_S, is_low_open=True, unit="seconds"),
    "disk.expansion_factor": Bounds(1, 100),
    "disk.reserve_bytes": Bounds(0, MAX_INTEGER, unit="bytes"),
    "disk.reserve_percent": Bounds(0, 90),
    "cluster.status_interval_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "cluster.progress_interval_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "cluster.heartbeat_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "cluster.request_timeout_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "cluster.control_plane_pull_pause_s": Bounds(0, 600, unit="seconds"),
    "store.max_bytes": Bounds(0, MAX_INTEGER, unit="bytes"),
    "store.max_percent": Bounds(0, 100),
    "store.gc_grace_s": Bounds(0, 30 * _DAY_S, unit="seconds"),
    "offline.interval_s": Bounds(10, _DAY_S, unit="seconds"),
    "node_os.timeout_s": Bounds(0, 600, is_low_open=True, unit="seconds"),
    "node_os.interval_s": Bounds(60, _DAY_S, unit="seconds"),
    "mirror.max_connections": Bounds(1, 1024),
    "mirror.request_timeout_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "mirror.miss_wait_s": Bounds(0, 600, unit="seconds"),
    "site.max_uploads": Bounds(1, 256),
    "site.upload_max_bytes": Bounds(0, MAX_INTEGER, unit="bytes"),
    "site.fetch_concurrency": Bounds(1, 16),
    "site.request_timeout_s": Bounds(0, _HOUR_S, is_low_open=True, unit="seconds"),
    "site.handshake_timeout_s": Bounds(0, 60, is_low_open=True, unit="seconds"),
    "site.max_connections": Bounds(1, 1024),
    "site.max_connections_per_source": Bounds(1, 1024),
    "site.fetch_min_rate_bytes": Bounds(1 << 10, 1 << 30, unit="bytes"),
    "upgrade.keep_releases": Bounds(MIN_KEEP_RELEASES, 100),
}
"""Every numeric key's range; each field's docstring in ``settings`` states it ("Range: …")."""


def _is_node_name(name: str, _: Config) -> bool:
    return name == "" or (len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None)


def _is_selector(text: str, _: Config) -> bool:
    try:
        parse_selector(text)
    except ConfigInvalid:
        return False
    return True


def _are_networks(texts: tuple[str, ...], _: Config) -> bool:
    """Each an address with its prefix length, host bits zero (``ipaddress.ip_network``)."""
    try:
        for text in texts:
            ipaddress.ip_network(text, strict=True)
    except ValueError:
        return False
    return True


def _is_at_least_initial(value: float, config: Config) -> bool:
    return value >= config.pull.backoff_initial_s


_FS_NAMES = ", ".join(KNOWN_MEDIA_FS_TYPES)
_BUS_NAMES = ", ".join(KNOWN_MEDIA_BUSES)


def _is_known_fs_list(names: tuple[str, ...], _: Config) -> bool:
    """``[bundles] media_fs_types``: at least one, each a known name."""
    return bool(names) and all(name in KNOWN_MEDIA_FS_TYPES for name in names)


def _is_known_bus_list(names: tuple[str, ...], _: Config) -> bool:
    """``[bundles] media_buses``: at least one, each a known name."""
    return bool(names) and all(name in KNOWN_MEDIA_BUSES for name in names)


API_SETS_MODES = ("auto", "nodeagent", "mcd")
"""``[cluster] api_sets`` (``cluster.ownership`` reads it)."""

_RULES: tuple[tuple[str, str, Callable[[Any, Config], bool]], ...] = (
    *((dotted, bounds.text, bounds) for dotted, bounds in BOUNDS.items()),
    ("runtime.endpoint", "unix:///<socket path>", lambda v, _: v.startswith(UNIX_PREFIX + "/")),
    ("runtime.dropin_name", "a plain file name without '/'", _is_file_name),
    ("runtime.unit", "a systemd unit name such as crio.service", _is_file_name),
    ("specs.dirs", "distinct directories", lambda v, _: len(set(v)) == len(v)),
    ("specs.dirs", "at most 16 directories", lambda v, _: len(v) <= 16),
    (
        "pull.backoff_max_s",
        "at least pull.backoff_initial_s ({config.pull.backoff_initial_s})",
        _is_at_least_initial,
    ),
    ("bundles.mirror_dropin_name", "a plain file name without '/'", _is_file_name),
    ("bundles.label_pattern", "a non-empty glob", lambda v, _: bool(v)),
    ("bundles.media_fs_types", f"1 to 11 of {_FS_NAMES}", _is_known_fs_list),
    ("bundles.media_buses", f"1 to 7 of {_BUS_NAMES}", _is_known_bus_list),
    ("bundles.media_fs_types", "distinct names", lambda v, _: len(set(v)) == len(v)),
    ("bundles.media_buses", "distinct names", lambda v, _: len(set(v)) == len(v)),
    ("cluster.node_name", 'a DNS subdomain (lowercase) or ""', _is_node_name),
    (
        "cluster.set_selector",
        "a label selector as kubectl -l takes it, e.g. 'env=edge,zone in (a,b)'",
        _is_selector,
    ),
    ("cluster.api_sets", "one of auto, nodeagent, mcd", lambda v, _: v in API_SETS_MODES),
    ("cluster.event_namespace", "a namespace name", lambda v, c: _is_node_name(v, c) and v),
    ("site.listen", "address:port, e.g. 0.0.0.0:9447 or [::]:9447", lambda v, _: is_address(v)),
    ("site.advertise", 'host:port or ""', lambda v, _: v == "" or is_address(v)),
    ("site.peers", "a list of host:port addresses", lambda v, _: all(map(is_address, v))),
    ("site.peers", "distinct addresses", lambda v, _: len(set(v)) == len(v)),
    ("site.follow", "one of on, off, auto", lambda v, _: v in ("on", "off", "auto")),
    (
        "site.max_connections_per_source",
        "at most site.max_connections ({config.site.max_connections})",
        lambda v, c: v <= c.site.max_connections,
    ),
    ("site.allow_from", "a list of networks such as 10.0.0.0/24", _are_networks),
    ("metrics.listen", "address:port, e.g. 127.0.0.1:9448", lambda v, _: is_address(v)),
    ("mirror.listen", "a loopback address:port, e.g. 127.0.0.1:22626", _is_loopback_address),
    ("log.level", f"one of {', '.join(LOG_LEVELS)}", lambda v, _: v in LOG_LEVELS),
    (
        "upgrade.start",
        f"one of {', '.join(UPGRADE_START_MODES)}",
        lambda v, _: v in UPGRADE_START_MODES,
    ),
)
# A rule that compares two keys blames the other key's file when its own key kept the default.
_RELATED = {
    "pull.backoff_max_s": "pull.backoff_initial_s",
    "site.max_connections_per_source": "site.max_connections",
}


def _validate(config: Config, origins: Mapping[str, Path]) -> None:
    for dotted, wanted, holds in _RULES:
        section, _, key = dotted.partition(".")
        value = getattr(getattr(config, section), key)
        if not holds(value, config):
            origin = (
                origins.get(dotted)
                or origins.get(_RELATED.get(dotted, ""))
                or "the built-in defaults"
            )
            shown = clip(repr([str(v) for v in value]), 120) if isinstance(value, tuple) else None
            must = wanted.format(config=config)
            raise ConfigInvalid(
                f"{dotted} in {origin} must be {must}, got {shown or _shown(value)}"
            )
