"""Configuration values out of every range: refused at load, naming key and file (issue 13).

Each case once crashed later (``call_timeout_s = 1e308`` overflowed a deadline, a 400-digit
integer could not become a float) or was echoed whole into a message.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from nodeagent.cli.main import main
from nodeagent.config import Config, load_config, reroot
from nodeagent.config import settings as settings_module
from nodeagent.config.loading import BOUNDS, MAX_CONFIG_FILE_BYTES
from nodeagent.errors import ConfigInvalid

MAIN = Path("/etc/nodeagent/config.toml")
DROPIN = "/etc/nodeagent/config.d/50-site.toml"
SETTINGS = Path(settings_module.__file__)
"""The module imported (the installed one in the RPM's %check, which has no source tree)."""


def refusal(root: Path, host_file: str, text: str) -> str:
    path = reroot(Path(host_file), root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(ConfigInvalid) as caught:
        load_config(MAIN, root=root)
    return caught.value.message


HUGE = "1" + "0" * 399
# (TOML text, key the message names, what it says the value must be)
CRASH_INPUTS = [
    ("[runtime]\ncall_timeout_s = 1e308\n", "runtime.call_timeout_s", "at most 3600 seconds"),
    ("[runtime]\ncall_timeout_s = inf\n", "runtime.call_timeout_s", "a finite number"),
    ("[runtime]\ncall_timeout_s = -inf\n", "runtime.call_timeout_s", "a finite number"),
    ("[runtime]\ncall_timeout_s = nan\n", "runtime.call_timeout_s", "a finite number"),
    (f"[runtime]\ncall_timeout_s = {HUGE}\n", "runtime.call_timeout_s", "below 2^63"),
    (f"[pull]\nconcurrency = {HUGE}\n", "pull.concurrency", "an integer below 2^63"),
    (f"[pull]\nattempts = -{HUGE}\n", "pull.attempts", "an integer below 2^63"),
    (f"[disk]\nreserve_bytes = {HUGE}\n", "disk.reserve_bytes", "below 2^63"),
    ('[disk]\nreserve_bytes = "99999999EiB"\n', "disk.reserve_bytes", "below 2^63"),
    ('[disk]\nreserve_bytes = "-1GiB"\n', "disk.reserve_bytes", 'such as "2GiB"'),
    ("[pull]\nshared_layer_min_bytes = -1\n", "pull.shared_layer_min_bytes", "from 0 to 2^63-1"),
    ("[pull]\nconcurrency = 100000\n", "pull.concurrency", "from 1 to 64"),
    ("[pull]\nstall_timeout_s = 1e9\n", "pull.stall_timeout_s", "at most 86400 seconds"),
    ("[pull]\nbackoff_max_s = 1e300\n", "pull.backoff_max_s", "at most 86400 seconds"),
    ("[disk]\nexpansion_factor = 1e308\n", "disk.expansion_factor", "from 1 to 100"),
    ("[cluster]\nheartbeat_s = 0\n", "cluster.heartbeat_s", "greater than 0"),
    ("[cluster]\nrequest_timeout_s = 1e308\n", "cluster.request_timeout_s", "at most 3600"),
    ("[runtime]\ncall_timeout_s = [1]\n", "runtime.call_timeout_s", "a number, got a list"),
    ("[runtime]\ncall_timeout_s = {a = 1}\n", "runtime.call_timeout_s", "a number, got a table"),
    ("[runtime]\ncall_timeout_s = 1979-05-27\n", "runtime.call_timeout_s", "a number"),
    ('[runtime]\nendpoint = ["unix:///a"]\n', "runtime.endpoint", "a string, got a list"),
    ('[state]\ndir = "/var/\\u0000lib"\n', "state.dir", "without NUL"),
    ("[bundles]\nwatch_media = 1\n", "bundles.watch_media", "true or false"),
    ("[specs]\ndirs = [" + ", ".join(f'"/d{i}"' for i in range(17)) + "]\n", "specs.dirs", "16"),
]


@pytest.mark.parametrize(("text", "dotted", "fragment"), CRASH_INPUTS)
@pytest.mark.parametrize("host_file", [str(MAIN), DROPIN])
def test_a_value_out_of_range_names_key_and_file(
    tmp_path: Path, host_file: str, text: str, dotted: str, fragment: str
) -> None:
    message = refusal(tmp_path, host_file, text)
    assert message.startswith(f"{dotted} in {reroot(Path(host_file), tmp_path)} must be ")
    assert fragment in message
    assert len(message) < 600


def test_an_integer_python_cannot_read_names_the_file(tmp_path: Path) -> None:
    message = refusal(tmp_path, DROPIN, "[pull]\nconcurrency = " + "9" * 5000 + "\n")
    assert message.startswith(str(reroot(Path(DROPIN), tmp_path)))
    assert "too long" in message
    assert len(message) < 400


def test_a_float_literal_that_overflows_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, str(MAIN), "[runtime]\ncall_timeout_s = 1e999\n")
    assert "1e999 is out of range" in message


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    text = '[log]\nlevel = "' + "x" * (10 * 1024 * 1024) + '"\n'
    message = refusal(tmp_path, DROPIN, text)
    assert f"more than the {MAX_CONFIG_FILE_BYTES} allowed" in message
    assert str(reroot(Path(DROPIN), tmp_path)) in message
    assert len(message) < 400


def test_a_long_string_is_refused_and_not_echoed(tmp_path: Path) -> None:
    message = refusal(tmp_path, str(MAIN), '[log]\nlevel = "' + "x" * 100_000 + '"\n')
    assert message.startswith("log.level in ")
    assert "at most 4096 characters" in message
    assert len(message) < 600


def test_a_long_unknown_key_is_clipped(tmp_path: Path) -> None:
    message = refusal(tmp_path, str(MAIN), "[pull]\n" + "k" * 50_000 + " = 1\n")
    assert message.startswith("unknown key pull.kkk")
    assert len(message) < 1000


def test_escape_sequences_in_a_value_are_escaped(tmp_path: Path) -> None:
    message = refusal(tmp_path, str(MAIN), '[log]\nlevel = "\\u001b[2Jx"\n')
    assert "\x1b" not in message
    assert "\\x1b" in message


def test_not_utf8_and_duplicate_keys_name_the_file(tmp_path: Path) -> None:
    path = reroot(Path(DROPIN), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'[log]\nlevel = "\xff"\n')
    with pytest.raises(ConfigInvalid, match="not UTF-8"):
        load_config(MAIN, root=tmp_path)
    path.write_text('[log]\nlevel = "info"\nlevel = "debug"\n')
    with pytest.raises(ConfigInvalid, match=re.escape(f"{path} is not valid TOML")):
        load_config(MAIN, root=tmp_path)


def test_the_edges_of_each_range_load(tmp_path: Path) -> None:
    tables: dict[str, list[str]] = {}
    for dotted, bounds in BOUNDS.items():
        section, _, key = dotted.partition(".")
        high = int(bounds.high) if float(bounds.high).is_integer() else bounds.high
        tables.setdefault(section, []).append(f"{key} = {high}")
    text = "".join(f"[{name}]\n" + "\n".join(lines) + "\n" for name, lines in tables.items())
    config = load_config(_written(tmp_path, text))
    assert config.runtime.call_timeout_s == 3600
    assert config.disk.reserve_bytes == 2**63 - 1


def test_check_config_exits_78_on_an_out_of_range_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _written(tmp_path, "[runtime]\ncall_timeout_s = 1e308\n")
    assert main(["--config", str(path), "check-config"]) == ConfigInvalid.exit_code == 78
    assert "ConfigInvalid: runtime.call_timeout_s in" in capsys.readouterr().err


def test_every_numeric_key_has_bounds() -> None:
    numeric = set()
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        if not dataclasses.is_dataclass(cls):
            continue
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):
            if hints[item.name] in (int, float):
                numeric.add(f"{section.name}.{item.name}")
    assert numeric == set(BOUNDS)


def test_every_field_docstring_states_its_range() -> None:
    docs = _field_docs("\n".join(path.read_text() for path in sorted(SETTINGS.parent.glob("*.py"))))
    for dotted, bounds in BOUNDS.items():
        assert f"Range: {bounds.text}." in docs[dotted], dotted


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _field_docs(source: str) -> dict[str, str]:
    """``section.key`` → the field's docstring, whitespace collapsed."""
    tables = {
        "Runtime": "runtime",
        "Pull": "pull",
        "Disk": "disk",
        "Cluster": "cluster",
        "Store": "store",
        "Site": "site",
        "Mirror": "mirror",
        "Offline": "offline",
        "NodeOs": "node_os",
        "Upgrade": "upgrade",
    }
    found: dict[str, str] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef) or cls.name.removesuffix("Settings") not in tables:
            continue
        section = tables[cls.name.removesuffix("Settings")]
        for field, doc in zip(cls.body, cls.body[1:], strict=False):
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                text = ast.literal_eval(doc.value) if isinstance(doc, ast.Expr) else ""
                found[f"{section}.{field.target.id}"] = " ".join(str(text).split())
    return found
