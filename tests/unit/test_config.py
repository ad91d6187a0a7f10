"""Unit tests of configuration loading: defaults, drop-ins, errors and the test root."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import DEFAULT_CONFIG_PATH, Config, load_config, reroot
from nodeagent.errors import ConfigInvalid

GIB = 1024**3
MAIN = Path("/etc/nodeagent/config.toml")


def value_at(config: Config, dotted: str) -> Any:
    section, _, key = dotted.partition(".")
    return getattr(getattr(config, section), key)


def write(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (host path → TOML text) under ``root``."""
    for host_path, text in files.items():
        path = reroot(Path(host_path), root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def load(root: Path, files: dict[str, str]) -> Config:
    write(root, files)
    return load_config(MAIN, root=root)


def host_paths(config: Config) -> list[Path]:
    """Every path the configuration holds, outside the sections too."""
    paths: list[object] = [config.source, config.dropin_dir, *config.files]
    for item in dataclasses.fields(config):
        section = getattr(config, item.name)
        if not dataclasses.is_dataclass(section):
            continue
        for key in dataclasses.fields(section):
            value = getattr(section, key.name)
            paths.extend(value if isinstance(value, tuple) else [value])
    return [p for p in paths if isinstance(p, Path)]


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        ("runtime.endpoint", "unix:///var/run/crio/crio.sock"),
        ("runtime.config_file", Path("/etc/crio/crio.conf")),
        ("runtime.config_dir", Path("/etc/crio/crio.conf.d")),
        ("runtime.transient_dropin_dir", Path("/run/crio/crio.conf.d")),
        ("runtime.dropin_name", "99-nodeagent-pinned-images.conf"),
        ("runtime.unit", "crio.service"),
        ("runtime.pid_file", None),
        ("runtime.reload_timeout_s", 60.0),
        ("runtime.call_timeout_s", 30.0),
        (
            "specs.dirs",
            (Path("/etc/nodeagent/pinnedimagesets.d"), Path("/run/nodeagent/pinnedimagesets.d")),
        ),
        ("pull.auth_file", Path("/var/lib/kubelet/config.json")),
        ("pull.concurrency", 6),
        ("pull.attempts", 5),
        ("pull.backoff_initial_s", 1.0),
        ("pull.backoff_max_s", 60.0),
        ("pull.stall_timeout_s", 300.0),
        ("pull.shared_layer_min_bytes", 16 * 1024**2),
        ("disk.expansion_factor", 2.0),
        ("disk.reserve_bytes", 2 * GIB),
        ("disk.reserve_percent", 15.0),
        ("state.dir", Path("/var/lib/nodeagent")),
        ("log.level", "info"),
    ],
)
def test_defaults_apply_when_no_file_exists(tmp_path: Path, dotted: str, expected: object) -> None:
    loaded = load_config(tmp_path / "missing.toml")
    assert value_at(loaded, dotted) == expected
    assert value_at(Config.default(), dotted) == expected
    assert loaded.files == ()


def test_default_convenience_paths() -> None:
    config = Config.default()
    assert config.source == DEFAULT_CONFIG_PATH
    assert config.dropin_dir == Path("/etc/nodeagent/config.d")
    assert config.specs_persistent_dir == Path("/etc/nodeagent/pinnedimagesets.d")
    assert config.specs_transient_dirs == (Path("/run/nodeagent/pinnedimagesets.d"),)
    assert config.spec_dirs() == (
        (Path("/etc/nodeagent/pinnedimagesets.d"), True),
        (Path("/run/nodeagent/pinnedimagesets.d"), False),
    )
    assert config.runtime.persistent_dropin_path == Path(
        "/etc/crio/crio.conf.d/99-nodeagent-pinned-images.conf"
    )
    assert config.runtime.transient_dropin_path == Path(
        "/run/crio/crio.conf.d/99-nodeagent-pinned-images.conf"
    )


D = "/etc/nodeagent/config.d/"

# (files, expected values): later drop-ins override single keys, lists are replaced.
MERGES: list[tuple[dict[str, str], dict[str, object]]] = [
    (
        {
            str(MAIN): "[pull]\nconcurrency = 2\nattempts = 7\n",
            D + "10-a.toml": "[pull]\nconcurrency = 3\n",
        },
        {"pull.concurrency": 3, "pull.attempts": 7},
    ),
    (
        {
            D + "10-a.toml": "[pull]\nconcurrency = 3\n",
            D + "20-b.toml": "[pull]\nconcurrency = 5\n",
        },
        {"pull.concurrency": 5},
    ),
    (  # lexical, not numeric: "9-" sorts after "10-"
        {
            D + "9-a.toml": "[pull]\nconcurrency = 9\n",
            D + "10-b.toml": "[pull]\nconcurrency = 10\n",
        },
        {"pull.concurrency": 9},
    ),
    (
        {str(MAIN): '[specs]\ndirs = ["/a", "/b"]\n', D + "50-x.toml": '[specs]\ndirs = ["/c"]\n'},
        {"specs.dirs": (Path("/c"),)},
    ),
    (  # only *.toml, and no hidden files
        {
            D + "10-a.toml": "[pull]\nconcurrency = 3\n",
            D + "20-b.conf": "[pull]\nconcurrency = 20\n",
            D + ".30-c.toml": "[pull]\nconcurrency = 30\n",
            D + "40-d.toml.bak": "[pull]\nconcurrency = 40\n",
        },
        {"pull.concurrency": 3},
    ),
    (
        {
            str(MAIN): '[disk]\nreserve_bytes = "500MB"\n',
            D + "1.toml": "[disk]\nreserve_percent = 5\n",
        },
        {"disk.reserve_bytes": 500_000_000, "disk.reserve_percent": 5.0},
    ),
    ({str(MAIN): "[disk]\nreserve_bytes = 1024\n"}, {"disk.reserve_bytes": 1024}),
    (
        {str(MAIN): '[pull]\nshared_layer_min_bytes = "1EiB"\n'},
        {"pull.shared_layer_min_bytes": 1024**6},
    ),
    ({str(MAIN): '[disk]\nreserve_bytes = "1.5G"\n'}, {"disk.reserve_bytes": 1_500_000_000}),
    ({str(MAIN): "[runtime]\nreload_timeout_s = 5\n"}, {"runtime.reload_timeout_s": 5.0}),
    ({str(MAIN): '[runtime]\npid_file = ""\n'}, {"runtime.pid_file": None}),
    ({str(MAIN): '[log]\nlevel = "debug"\n'}, {"log.level": "debug"}),
]


@pytest.mark.parametrize(("files", "expected"), MERGES)
def test_dropins_override_keys_in_lexical_order(
    tmp_path: Path, files: dict[str, str], expected: dict[str, object]
) -> None:
    config = load(tmp_path, files)
    for dotted, value in expected.items():
        # paths come back re-rooted under the test's root
        wanted = tuple(reroot(p, tmp_path) for p in value) if isinstance(value, tuple) else value
        assert value_at(config, dotted) == wanted, dotted
        assert type(value_at(config, dotted)) is type(wanted), dotted


def test_files_lists_what_was_read_in_order(tmp_path: Path) -> None:
    config = load(tmp_path, {str(MAIN): "", D + "b.toml": "", D + "a.toml": ""})
    assert config.files == (
        tmp_path / "etc/nodeagent/config.toml",
        tmp_path / "etc/nodeagent/config.d/a.toml",
        tmp_path / "etc/nodeagent/config.d/b.toml",
    )


# (file written, its text, dotted key the message must name)
UNKNOWN = [
    (str(MAIN), "[pulls]\nconcurrency = 1\n", "unknown key pulls in"),
    (str(MAIN), "[pull]\nconcurency = 1\n", "unknown key pull.concurency in"),
    (str(MAIN), "[pull.extra]\nx = 1\n", "unknown key pull.extra in"),
    (str(MAIN), "concurrency = 1\n", "unknown key concurrency in"),
    (D + "10-a.toml", "[runtime]\nsocket = '/x'\n", "unknown key runtime.socket in"),
]


@pytest.mark.parametrize(("host_file", "text", "fragment"), UNKNOWN)
def test_unknown_key_names_key_and_file(
    tmp_path: Path, host_file: str, text: str, fragment: str
) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, {host_file: text})
    assert f"{fragment} {reroot(Path(host_file), tmp_path)};" in caught.value.message


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalid, match=r"did you mean pull\.concurrency\?"):
        load(tmp_path, {str(MAIN): "[pull]\nconcurency = 1\n"})


# (TOML text, message after "<key> in <file> ")
WRONG_TYPES = [
    ('[pull]\nconcurrency = "x"\n', "pull.concurrency", "must be an integer, got 'x'"),
    ("[pull]\nconcurrency = true\n", "pull.concurrency", "must be an integer, got True"),
    ("[pull]\nconcurrency = 1.5\n", "pull.concurrency", "must be an integer, got 1.5"),
    ('[pull]\nbackoff_max_s = "1m"\n', "pull.backoff_max_s", "must be a number, got '1m'"),
    ("[pull]\nstall_timeout_s = inf\n", "pull.stall_timeout_s", "must be a finite number, got inf"),
    ("[runtime]\nendpoint = 5\n", "runtime.endpoint", "must be a string, got 5"),
    ('[state]\ndir = "var/lib/x"\n', "state.dir", "must be an absolute path, got 'var/lib/x'"),
    ('[runtime]\npid_file = "crio.pid"\n', "runtime.pid_file", 'must be an absolute path or ""'),
    ('[specs]\ndirs = "/a"\n', "specs.dirs", "must be a non-empty list of absolute paths"),
    ("[specs]\ndirs = []\n", "specs.dirs", "must be a non-empty list of absolute paths"),
    ('[specs]\ndirs = ["/a", "b"]\n', "specs.dirs", "must be a non-empty list of absolute paths"),
    ('[disk]\nreserve_bytes = "lots"\n', "disk.reserve_bytes", 'size such as "2GiB"'),
    ("[disk]\nreserve_bytes = 1.5\n", "disk.reserve_bytes", "must be a number of bytes"),
    ('[store]\nmax_bytes = "huge"\n', "store.max_bytes", 'size such as "2GiB"'),
    ('[store]\nkeep_newest_per_channel = "yes"\n', "store.keep_newest_per_channel", "true or"),
    ('[store]\npath = "store"\n', "store.path", 'must be an absolute path or ""'),
    ("pull = 3\n", "pull", "must be a table [pull], got 3"),
]


@pytest.mark.parametrize(("text", "dotted", "fragment"), WRONG_TYPES)
def test_wrong_type_names_key_and_file(
    tmp_path: Path, text: str, dotted: str, fragment: str
) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, {str(MAIN): text})
    assert caught.value.message.startswith(f"{dotted} in {tmp_path / 'etc/nodeagent/config.toml'} ")
    assert fragment in caught.value.message


def test_wrong_type_message_is_the_documented_one(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[pull]\nconcurrency = "x"\n')
    with pytest.raises(ConfigInvalid) as caught:
        load_config(path)
    assert caught.value.message == f"pull.concurrency in {path} must be an integer, got 'x'"


# (TOML text, key, what the message must say)
OUT_OF_RANGE = [
    ("[pull]\nconcurrency = 0\n", "pull.concurrency", "must be from 1 to 64, got 0"),
    ("[pull]\nattempts = 0\n", "pull.attempts", "must be from 1 to 1000, got 0"),
    ("[pull]\nbackoff_initial_s = 0\n", "pull.backoff_initial_s", "must be greater than 0"),
    ("[pull]\nstall_timeout_s = -1\n", "pull.stall_timeout_s", "must be greater than 0"),
    ("[runtime]\nreload_timeout_s = 0\n", "runtime.reload_timeout_s", "must be greater than 0"),
    ("[runtime]\ncall_timeout_s = -0.5\n", "runtime.call_timeout_s", "must be greater than 0"),
    ("[disk]\nexpansion_factor = 0.5\n", "disk.expansion_factor", "must be from 1 to 100"),
    ("[disk]\nreserve_percent = 91\n", "disk.reserve_percent", "must be from 0 to 90"),
    ("[disk]\nreserve_percent = -1\n", "disk.reserve_percent", "must be from 0 to 90"),
    ("[disk]\nreserve_bytes = -1\n", "disk.reserve_bytes", "must be from 0 to 2^63-1 bytes"),
    ('[runtime]\ndropin_name = "a/b.conf"\n', "runtime.dropin_name", "a plain file name"),
    ('[runtime]\ndropin_name = ".."\n', "runtime.dropin_name", "a plain file name"),
    ('[runtime]\ndropin_name = ""\n', "runtime.dropin_name", "a plain file name"),
    ('[runtime]\nunit = ""\n', "runtime.unit", "a systemd unit name"),
    ('[runtime]\nendpoint = "tcp://x:1"\n', "runtime.endpoint", "unix:///<socket path>"),
    ('[runtime]\nendpoint = "unix://crio.sock"\n', "runtime.endpoint", "unix:///<socket path>"),
    ('[specs]\ndirs = ["/a", "/a"]\n', "specs.dirs", "distinct directories, got ['/a', '/a']"),
    ('[log]\nlevel = "verbose"\n', "log.level", "one of debug, info, warning, error"),
    ('[bundles]\nmedia_fs_types = ["ntfs"]\n', "bundles.media_fs_types", "1 to 11 of btrfs, erofs"),
    ("[bundles]\nmedia_fs_types = []\n", "bundles.media_fs_types", "1 to 11 of btrfs"),
    ('[bundles]\nmedia_fs_types = ["vfat", "vfat"]\n', "bundles.media_fs_types", "distinct"),
    ('[bundles]\nmedia_buses = ["firewire"]\n', "bundles.media_buses", "1 to 7 of usb, mmc, loop"),
    ("[bundles]\nmedia_buses = []\n", "bundles.media_buses", "1 to 7 of usb"),
    ('[bundles]\nmedia_buses = ["usb", "usb"]\n', "bundles.media_buses", "distinct names"),
    ("[store]\nmax_bytes = -1\n", "store.max_bytes", "from 0 to 2^63-1 bytes"),
    ("[store]\nmax_percent = 101\n", "store.max_percent", "from 0 to 100"),
    ("[store]\ngc_grace_s = -5\n", "store.gc_grace_s", "from 0 to 2592000 seconds"),
    ("[store]\ngc_grace_s = 1e300\n", "store.gc_grace_s", "from 0 to 2592000 seconds"),
    (
        "[pull]\nbackoff_initial_s = 10\nbackoff_max_s = 5\n",
        "pull.backoff_max_s",
        "must be at least pull.backoff_initial_s (10.0), got 5.0",
    ),
    (
        "[pull]\nbackoff_initial_s = 120\n",
        "pull.backoff_max_s",
        "must be at least pull.backoff_initial_s (120.0), got 60.0",
    ),
]


@pytest.mark.parametrize(("text", "dotted", "fragment"), OUT_OF_RANGE)
def test_out_of_range_names_key_and_file(
    tmp_path: Path, text: str, dotted: str, fragment: str
) -> None:
    dropin = D + "10-site.toml"
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, {dropin: text})
    assert caught.value.message.startswith(f"{dotted} in {reroot(Path(dropin), tmp_path)} ")
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("[pull\n", "is not valid TOML"), ("a = 1\na = 2\n", "is not valid TOML")],
)
def test_broken_toml_names_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, {D + "10-x.toml": text})
    assert caught.value.message.startswith(
        f"{tmp_path / 'etc/nodeagent/config.d/10-x.toml'} {fragment}"
    )


def test_dangling_dropin_link_is_an_error(tmp_path: Path) -> None:
    dropins = tmp_path / "etc/nodeagent/config.d"
    dropins.mkdir(parents=True)
    (dropins / "10-gone.toml").symlink_to(tmp_path / "nowhere.toml")
    with pytest.raises(ConfigInvalid, match=r"10-gone\.toml: no such file"):
        load_config(MAIN, root=tmp_path)


@pytest.mark.parametrize("how", ["load_config", "Config.default"])
def test_root_reroots_every_path(tmp_path: Path, how: str) -> None:
    root = tmp_path / "root"
    files = {str(MAIN): '[runtime]\npid_file = "/run/crio.pid"\n', D + "1.toml": ""}
    config = load(root, files) if how == "load_config" else Config.default(root)
    paths = host_paths(config)
    assert len(paths) >= 9
    assert all(p.is_relative_to(root) for p in paths), [
        p for p in paths if not p.is_relative_to(root)
    ]
    assert config.runtime.endpoint == f"unix://{root}/var/run/crio/crio.sock"
    assert config.runtime.config_dir == root / "etc/crio/crio.conf.d"
    assert config.source == root / "etc/nodeagent/config.toml"
    assert config.dropin_dir == root / "etc/nodeagent/config.d"
    assert config.specs_persistent_dir == root / "etc/nodeagent/pinnedimagesets.d"


def test_root_reroots_paths_given_in_files(tmp_path: Path) -> None:
    files = {
        str(MAIN): '[specs]\ndirs = ["/srv/sets"]\n[state]\ndir = "/srv/state"\n',
        D + "9.toml": '[runtime]\nendpoint = "unix:///srv/crio.sock"\npid_file = "/srv/crio.pid"\n',
    }
    config = load(tmp_path, files)
    assert config.specs.dirs == (tmp_path / "srv/sets",)
    assert config.state.dir == tmp_path / "srv/state"
    assert config.runtime.pid_file == tmp_path / "srv/crio.pid"
    assert config.runtime.endpoint == f"unix://{tmp_path}/srv/crio.sock"


def test_without_root_paths_are_taken_as_written(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[state]\ndir = "/srv/state"\n')
    config = load_config(path)
    assert config.state.dir == Path("/srv/state")
    assert config.runtime.config_dir == Path("/etc/crio/crio.conf.d")
    assert config.runtime.endpoint == "unix:///var/run/crio/crio.sock"
    assert (config.source, config.dropin_dir, config.files) == (
        path,
        tmp_path / "config.d",
        (path,),
    )


def test_store_dir_defaults_under_the_state_dir_and_follows_the_root(tmp_path: Path) -> None:
    config = load(
        tmp_path, {str(MAIN): '[state]\ndir = "/srv/state"\n[store]\nmax_bytes = "2GiB"\n'}
    )
    assert config.store_dir == tmp_path / "srv/state/store"
    assert config.store.max_bytes == 2 * 1024**3
    moved = load(tmp_path, {str(MAIN): '[store]\npath = "/data/store"\n'})
    assert moved.store_dir == tmp_path / "data/store"
