"""nodeagent's configuration: a TOML main file plus ``config.d/*.toml`` drop-ins.

The drop-ins live in ``<directory of the main file>/config.d`` and apply in
lexical file-name order (names starting with ``.`` are skipped: editors' and
atomic writers' temporary files). A later file overrides single keys of an
earlier one: tables merge key by key, lists are replaced whole. A missing main
file means the built-in defaults. Every unknown key, wrong type or out-of-range
value is a ``ConfigInvalid`` naming the dotted key and the file that set it.

``root`` re-roots every host path (tests run against a fake root, as fwupd
does): ``/etc/crio`` becomes ``<root>/etc/crio``, the socket in a ``unix://``
endpoint included. Paths in the files are always written as on the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.errors import ConfigInvalid
from nodeagent.selectors import parse_selector
from nodeagent.units import parse_size

DEFAULT_CONFIG_PATH = Path("/etc/nodeagent/config.toml")
DROPIN_DIR_NAME = "config.d"
LOG_LEVELS = ("debug", "info", "warning", "error")
_UNIX = "unix://"
_GIB = 1024**3
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """How to reach CRI-O, and where its configuration lives (``[runtime]``)."""

    endpoint: str = "unix:///var/run/crio/crio.sock"
    """CRI socket, ``unix://`` plus an absolute path. Default: CRI-O's socket on OpenShift."""
    config_file: Path = Path("/etc/crio/crio.conf")
    """CRI-O's main config file (default: CRI-O's). Its ``pinned_images`` are foreign pins that
    nodeagent's pin file must repeat: CRI-O replaces lists instead of merging them."""
    config_dir: Path = Path("/etc/crio/crio.conf.d")
    """The one drop-in directory CRI-O reads, its ``--config-dir`` (default: CRI-O's). The
    persistent pin file goes here; other files here that set ``pinned_images`` are foreign pins."""
    transient_dropin_dir: Path = Path("/run/crio/crio.conf.d")
    """Where the pin file of transient sets is written: tmpfs, gone at reboot like those sets.
    CRI-O reads it only when configured to."""
    dropin_name: str = "99-nodeagent-pinned-images.conf"
    """File name of the pin files, without ``/``. The default sorts after OpenShift's
    ``50-pinned-images``: the last file that sets ``pinned_images`` wins, so ours must."""
    unit: str = "crio.service"
    """systemd unit reloaded over D-Bus after a pin file changed (ExecReload sends SIGHUP)."""
    pid_file: Path | None = None
    """Fallback without systemd: a file holding the PID to send SIGHUP to. ``""`` (the default,
    stored as None) means the unit's MainPID only."""
    reload_timeout_s: float = 60.0
    """Seconds to wait for a reload. Default 60: a reload re-reads the registries configuration
    and re-pins every stored image, slow on a large store."""
    registries_conf: Path = Path("/etc/containers/registries.conf")
    """The registries configuration CRI-O pulls with; registries marked ``insecure`` there are
    read over plain HTTP by nodeagent's manifest look-ups too (disk admission)."""
    registries_dir: Path = Path("/etc/containers/registries.conf.d")
    """Drop-ins of ``registries_conf``, read in lexical order like containers/image does."""
    call_timeout_s: float = 30.0
    """Deadline in seconds of one short CRI call (version, list, status; pulls are governed by
    ``pull.stall_timeout_s``). Default 30: ListImages of a busy node with many images."""

    @property
    def persistent_dropin_path(self) -> Path:
        """The link in CRI-O's drop-in directory through which CRI-O reads the pin file."""
        return self.config_dir / self.dropin_name

    @property
    def transient_dropin_path(self) -> Path:
        """The pin file itself, on tmpfs: rebuilt from the ledger at every start."""
        return self.transient_dropin_dir / self.dropin_name


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """Where PinnedImageSet files are read from (``[specs]``)."""

    dirs: tuple[Path, ...] = (
        Path("/etc/nodeagent/pinnedimagesets.d"),
        Path("/run/nodeagent/pinnedimagesets.d"),
    )
    """Directories of PinnedImageSet YAML files, at least one. The first is persistent (its sets
    survive reboots), the others transient (``/run`` by default). A set defined twice is taken
    from the directory listed first."""


@dataclass(frozen=True, slots=True)
class PullSettings:
    """How images are pulled through CRI (``[pull]``)."""

    auth_file: Path = Path("/var/lib/kubelet/config.json")
    """Registry credentials (docker config JSON). Default: the kubelet's pull secret, so
    nodeagent pulls exactly what the node's pods can."""
    concurrency: int = 6
    """Pulls in flight at once, at least 1. Default 6: a pull through CRI-O waits about 23
    round trips to the registry, so over a 50 ms link throughput grows with the pulls in
    flight (4: 22 s, 6: 17 s, 8: 16 s for 50 images), while on a fast link, where CRI-O's
    CPU is the limit, 8 were 6 % slower than 4 (docs/performance.md). MCD uses 5 workers.
    Bundle imports use at most 4 (see ``bundles_build``)."""
    attempts: int = 5
    """Tries per image before it is reported failed (transient errors only), at least 1.
    Default 5, as MCD."""
    backoff_initial_s: float = 1.0
    """Seconds before the second try; doubled after each failed try. Default 1, as MCD."""
    backoff_max_s: float = 60.0
    """Largest delay in seconds between tries, at least ``backoff_initial_s``. Default 60
    (MCD: 10): gentler on a registry that is down for minutes."""
    shared_layer_min_bytes: int = 16 * 1024**2
    """A layer the runtime lacks, shared by several images and at least this big (compressed),
    is pulled with the first of them alone; the others start when it is done and find it
    stored. Without the wait, every pull in flight downloads it (CRI-O does not share
    downloads between pulls). Default 16MiB: waiting costs about one image's pull time,
    so it pays where ``concurrency - 1`` extra copies take longer than that (measured in
    docs/performance.md: small layers are cheaper to fetch twice). "0" waits for any
    shared layer; a huge size such as "1EiB" never waits."""
    stall_timeout_s: float = 300.0
    """Seconds without growth of the image filesystem after which a pull is stalled and retried.
    Default 300. There is no overall deadline: a slow but healthy pull of a large set goes on
    (MCD's 5-minute sync deadline reports those as Degraded)."""


@dataclass(frozen=True, slots=True)
class DiskSettings:
    """Disk admission before pulling (``[disk]``)."""

    expansion_factor: float = 2.0
    """Bytes on disk per compressed layer byte, to estimate the need from manifests before
    pulling; at least 1. Default 2, as MCD (gzip'd layers expand about 2-3 times)."""
    reserve_bytes: int = 2 * _GIB
    """Bytes that must stay free on the image filesystem after all admitted pulls; a number or
    a size such as ``"2GiB"``. Default 2 GiB. MCD keeps 16 GiB free, a quarter of a 64 GB edge
    disk, which refuses most sets there. The floor only has to cover what the node writes
    besides nodeagent's pulls: the kubelet pulling an application image (a few hundred MB,
    doubled on disk), container logs (rotated at 10 MiB x 5 files per container, about 1 GiB
    for 20 containers) and the journal. On larger filesystems ``reserve_percent`` dominates."""
    reserve_percent: float = 15.0
    """Percent of the filesystem's size that must stay free, 0 to 90; the larger of this and
    ``reserve_bytes`` applies. Default 15: the kubelet evicts pods below 15 % free on the image
    filesystem (``imagefs.available``, OpenShift's default too) and its image GC starts at 85 %
    used, deleting unpinned images, those pulled but not pinned yet included (the pin file is
    written last). Staying above keeps the node out of DiskPressure."""


@dataclass(frozen=True, slots=True)
class StateSettings:
    """nodeagent's own persistent state (``[state]``)."""

    dir: Path = Path("/var/lib/nodeagent")
    """Directory for state that must survive restarts and reboots (what was applied, with which
    result). Default: under ``/var/lib``, the unit's ``StateDirectory=``."""


@dataclass(frozen=True, slots=True)
class BundleSettings:
    """Upgrade bundles on removable media (``[bundles]``)."""

    watch_media: bool = True
    """Watch udev for removable media carrying bundles. Default true; false on nodes that
    only take bundles by hand (``nodeagent bundle import``)."""
    label_pattern: str = "NODEAGENT*"
    """Glob on the filesystem label of block devices that may carry a bundle. Default
    ``NODEAGENT*``: a factory labels its sticks so; other media are never touched."""
    trusted_keys_dir: Path = Path("/etc/nodeagent/trusted-keys.d")
    """minisign public keys (``*.pub``) whose signatures make a bundle authentic."""
    media_dir: Path = Path("/run/nodeagent/media")
    """Where media are mounted read-only (nosuid, nodev, noexec) while being imported."""
    mirror_dropin_name: str = "99-nodeagent-bundle-mirror.conf"
    """registries.conf drop-in (in ``runtime.registries_dir``) that points the runtime at the
    bundle served on loopback during an import; removed afterwards."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Cluster mode (``[cluster]``): PinnedImageSets from the Kubernetes API, status back to it."""

    enabled: bool = False
    """Read sets from the API server and report to it. Default false: a node without a cluster
    (or before it joins one) works from local spec files alone."""
    kubeconfig: Path = Path("/var/lib/kubelet/kubeconfig")
    """Credentials: the node's own identity (default: the kubelet's kubeconfig, whose client
    certificate is ``system:node:<name>``). The RBAC and admission policy in ``deploy/`` let that
    identity write only its own status object."""
    node_name: str = ""
    """This node's name in the cluster. ``""`` (default): the host name, as the kubelet does."""
    set_selector: str = ""
    """Without MachineConfigPools: the label selector (``kubectl -l`` syntax) a PinnedImageSet
    must match to apply to this node. ``""`` (default): every set. With pools, OpenShift's
    association decides and this is ignored."""
    status_interval_s: float = 5.0
    """A milestone (a set pinned or failed, a condition changed) is written at most this many
    seconds after the previous write (default 5)."""
    progress_interval_s: float = 30.0
    """Pull progress alone (counts, bytes, images in flight) is written at most once per this
    many seconds (default 30: with 500 nodes pulling, 60 s of pulls cost the API server
    2 writes per node instead of 12; docs/performance.md)."""
    heartbeat_s: float = 60.0
    """While pulls run, the status is written at least this often, so a slow pull shows as
    alive (default 60)."""
    events: bool = True
    """Post Kubernetes Events on the Node when a set is pinned or fails (default true)."""
    event_namespace: str = "default"
    """Namespace of those Events (Node events live in ``default``, as the kubelet's do)."""
    machine_config_node: bool = False
    """Also mirror per-set generations and the ``PinnedImageSets*`` conditions into the node's
    OpenShift MachineConfigNode status (default false: the machine-config-daemon owns it)."""
    request_timeout_s: float = 30.0
    """Timeout of one API request (watches excepted)."""


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Logging (``[log]``)."""

    level: str = "info"
    """Lowest level logged: debug, info, warning or error. Default info: each transition once."""


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration, one frozen value."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    """``[runtime]``: the CRI socket and CRI-O's configuration files."""
    specs: SpecSettings = field(default_factory=SpecSettings)
    """``[specs]``: where PinnedImageSets come from."""
    pull: PullSettings = field(default_factory=PullSettings)
    """``[pull]``: concurrency, retries and stall detection of pulls."""
    disk: DiskSettings = field(default_factory=DiskSettings)
    """``[disk]``: disk admission before pulls."""
    state: StateSettings = field(default_factory=StateSettings)
    """``[state]``: nodeagent's persistent state."""
    bundles: BundleSettings = field(default_factory=BundleSettings)
    """``[bundles]``: upgrade bundles on removable media."""
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """``[cluster]``: PinnedImageSets from the Kubernetes API and per-node status."""
    log: LogSettings = field(default_factory=LogSettings)
    """``[log]``: logging."""
    source: Path = DEFAULT_CONFIG_PATH
    """The main file (re-rooted); it need not exist."""
    dropin_dir: Path = DEFAULT_CONFIG_PATH.parent / DROPIN_DIR_NAME
    """The drop-in directory next to the main file (re-rooted); it need not exist."""
    files: tuple[Path, ...] = ()
    """The files actually read, in the order they were applied."""

    @classmethod
    def default(cls, root: Path | None = None) -> Config:
        """The built-in defaults, every host path re-rooted under ``root`` when given."""
        return _reroot_sections(_assemble({}, source=reroot(DEFAULT_CONFIG_PATH, root)), root)

    @property
    def specs_persistent_dir(self) -> Path:
        """The spec directory whose sets survive reboots (the first of ``specs.dirs``)."""
        return self.specs.dirs[0]

    @property
    def specs_transient_dirs(self) -> tuple[Path, ...]:
        """The spec directories whose sets are gone after a reboot (the rest)."""
        return self.specs.dirs[1:]

    @property
    def cluster_specs_dir(self) -> Path:
        """Where the sets the cluster assigns to this node are kept (persistent: they are the
        last known specs while the API server is unreachable, and after a reboot)."""
        return self.state.dir / "cluster" / "pinnedimagesets.d"

    def spec_dirs(self) -> tuple[tuple[Path, bool], ...]:
        """``(directory, is_persistent)`` pairs in priority order, for ``load_spec_dirs``."""
        dirs = tuple((path, index == 0) for index, path in enumerate(self.specs.dirs))
        if self.cluster.enabled:
            dirs += ((self.cluster_specs_dir, True),)
        return dirs


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
    return _reroot_sections(config, root)


def reroot(path: Path, root: Path | None) -> Path:
    """``path`` as seen under ``root``: ``/etc/x`` → ``<root>/etc/x``; unchanged without a root."""
    if root is None:
        return path
    return root / path.relative_to("/") if path.is_absolute() else root / path


# ---------------------------------------------------------------- reading and merging

_Layer = dict[str, dict[str, object]]


def _read_layer(file: Path, *, is_missing_ok: bool) -> _Layer | None:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        if is_missing_ok:
            return None
        raise ConfigInvalid(f"cannot read {file}: no such file (a dangling link?)") from None
    except OSError as exc:
        raise ConfigInvalid(f"cannot read {file}: {exc.strerror}") from exc
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigInvalid(f"{file} is not valid TOML: {exc}") from exc
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
            raise ConfigInvalid(f"{section} in {file} must be a table [{section}], got {table!r}")
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
        raise ConfigInvalid(f"{dotted} in {file} must be {exc.expected}, got {value!r}") from None


def _unknown_key_message(dotted: str, known: list[str], file: Path) -> str:
    import difflib  # noqa: PLC0415  only a broken config needs it

    close = difflib.get_close_matches(dotted, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
    return f"unknown key {dotted} in {file}; {hint}"


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


def _reroot_sections(config: Config, root: Path | None) -> Config:
    if root is None:
        return config
    sections = {name: _reroot_section(getattr(config, name), root) for name in _SECTIONS}
    return dataclasses.replace(config, **sections)


def _reroot_section(section: Any, root: Path) -> Any:
    changes: dict[str, object] = {}
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        if isinstance(value, Path):
            changes[item.name] = reroot(value, root)
        elif isinstance(value, tuple):
            changes[item.name] = tuple(reroot(p, root) for p in value)
        elif isinstance(value, str) and item.name == "endpoint" and value.startswith(_UNIX):
            changes[item.name] = _UNIX + str(reroot(Path(value.removeprefix(_UNIX)), root))
    return dataclasses.replace(section, **changes)


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
    return value


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _WrongTypeError("a number")
    return float(value)


def _as_str(value: object) -> str:
    if not isinstance(value, str):
        raise _WrongTypeError("a string")
    return value


def _as_path(value: object, expected: str = "an absolute path") -> Path:
    if not isinstance(value, str) or not value.startswith("/"):
        raise _WrongTypeError(expected)
    return Path(value)


def _as_optional_path(value: object) -> Path | None:
    return None if value == "" else _as_path(value, 'an absolute path or ""')


def _as_paths(value: object) -> tuple[Path, ...]:
    expected = "a non-empty list of absolute paths"
    if not isinstance(value, list) or not value:
        raise _WrongTypeError(expected)
    return tuple(_as_path(item, expected) for item in value)


def _as_size(value: object) -> int:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return parse_size(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _WrongTypeError('a number of bytes or a size such as "2GiB" or "500MB"')


_CONVERTERS: dict[object, _Converter] = {
    bool: _as_bool,
    int: _as_int,
    float: _as_float,
    str: _as_str,
    Path: _as_path,
    Path | None: _as_optional_path,
    tuple[Path, ...]: _as_paths,
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


def _is_file_name(name: str, _: Config) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _is_positive(value: float, _: Config) -> bool:
    return value > 0


def _is_node_name(name: str, _: Config) -> bool:
    return name == "" or (len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None)


def _is_selector(text: str, _: Config) -> bool:
    try:
        parse_selector(text)
    except ConfigInvalid:
        return False
    return True


def _is_at_least_initial(value: float, config: Config) -> bool:
    return value >= config.pull.backoff_initial_s


_RULES: tuple[tuple[str, str, Callable[[Any, Config], bool]], ...] = (
    ("runtime.endpoint", "unix:///<socket path>", lambda v, _: v.startswith(_UNIX + "/")),
    ("runtime.dropin_name", "a plain file name without '/'", _is_file_name),
    ("runtime.unit", "a systemd unit name such as crio.service", _is_file_name),
    ("runtime.reload_timeout_s", "greater than 0", _is_positive),
    ("runtime.call_timeout_s", "greater than 0", _is_positive),
    ("specs.dirs", "distinct directories", lambda v, _: len(set(v)) == len(v)),
    ("pull.concurrency", "at least 1", lambda v, _: v >= 1),
    ("pull.attempts", "at least 1", lambda v, _: v >= 1),
    ("pull.backoff_initial_s", "greater than 0", _is_positive),
    (
        "pull.backoff_max_s",
        "at least pull.backoff_initial_s ({config.pull.backoff_initial_s})",
        _is_at_least_initial,
    ),
    ("pull.stall_timeout_s", "greater than 0", _is_positive),
    ("disk.expansion_factor", "at least 1", lambda v, _: v >= 1),
    ("disk.reserve_bytes", "0 or more", lambda v, _: v >= 0),
    ("disk.reserve_percent", "between 0 and 90", lambda v, _: 0 <= v <= 90),
    ("bundles.mirror_dropin_name", "a plain file name without '/'", _is_file_name),
    ("bundles.label_pattern", "a non-empty glob", lambda v, _: bool(v)),
    ("cluster.node_name", 'a DNS subdomain (lowercase) or ""', _is_node_name),
    (
        "cluster.set_selector",
        "a label selector as kubectl -l takes it, e.g. 'env=edge,zone in (a,b)'",
        _is_selector,
    ),
    ("cluster.status_interval_s", "greater than 0", _is_positive),
    ("cluster.progress_interval_s", "greater than 0", _is_positive),
    ("cluster.heartbeat_s", "greater than 0", _is_positive),
    ("cluster.request_timeout_s", "greater than 0", _is_positive),
    ("cluster.event_namespace", "a namespace name", lambda v, c: _is_node_name(v, c) and v),
    ("log.level", f"one of {', '.join(LOG_LEVELS)}", lambda v, _: v in LOG_LEVELS),
)
# A rule that compares two keys blames the other key's file when its own key kept the default.
_RELATED = {"pull.backoff_max_s": "pull.backoff_initial_s"}


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
            shown = [str(v) for v in value] if isinstance(value, tuple) else value
            must = wanted.format(config=config)
            raise ConfigInvalid(f"{dotted} in {origin} must be {must}, got {shown!r}")
