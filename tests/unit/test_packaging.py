"""The packaging files agree with the code they ship: versions, locked modules, defaults,
the man page's commands, the udev rule's pattern, the unit's paths."""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from nodeagent import errors
from nodeagent.bundles.media import DEFAULT_LABEL_PATTERN, RULE_MARK
from nodeagent.cli import main as cli
from nodeagent.config import NODE_MIRROR_DROPIN_NAME, Config, load_config

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "nodeagent.spec"
DEPS_SPEC = PACKAGING / "nodeagent-bundled-deps.spec"
LOCK = PACKAGING / "bundled-requirements.txt"
TEMPLATE = PACKAGING / "config.toml"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return data


def locked() -> dict[str, str]:
    pins = re.findall(
        r"^([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:[0-9a-f]{64}$", LOCK.read_text(), re.M
    )
    return {normalized(name): version for name, version in pins}


@pytest.mark.parametrize("spec", [SPEC, DEPS_SPEC], ids=lambda p: p.name)
def test_spec_version_is_the_projects(spec: Path) -> None:
    found = re.search(r"^Version:\s*(\S+)$", spec.read_text(), re.M)
    assert found is not None
    assert found.group(1) == project()["version"]


def test_every_runtime_dependency_is_locked_with_a_hash() -> None:
    dependencies = project()["dependencies"]
    assert isinstance(dependencies, list)
    names = {normalized(re.split(r"[<>=!~ ;]", dep, maxsplit=1)[0]) for dep in dependencies}
    lock = locked()
    assert len(lock) == len(LOCK.read_text().splitlines()) - 3  # every line after the header
    assert names | {"lightkube"} <= set(lock)


def test_bundled_provides_list_every_locked_wheel() -> None:
    provides = re.findall(r"^Provides:\s+bundled\(python3dist\((\S+)\)\) = (\S+)$",
                          DEPS_SPEC.read_text(), re.M)  # fmt: skip
    assert {normalized(name): version for name, version in provides} == locked()


def test_config_template_only_shows_defaults(tmp_path: Path) -> None:
    """Loaded as shipped, and with every commented key switched on, it is the built-in default."""
    switched_on = tmp_path / "config.toml"
    switched_on.write_text(re.sub(r"^# ([a-z_]+ = )", r"\1", TEMPLATE.read_text(), flags=re.M))
    assert len(re.findall(r"^[a-z_]+ = ", switched_on.read_text(), re.M)) >= 25
    defaults = Config.default()
    for config in (load_config(TEMPLATE), load_config(switched_on)):
        for name, section in sections(defaults):
            assert getattr(config, name) == section, name


def sections(config: Config) -> list[tuple[str, object]]:
    skip = {"source", "dropin_dir", "files"}
    return [(f.name, getattr(config, f.name)) for f in fields(config) if f.name not in skip]


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    found = []
    for action in parser._actions:  # argparse has no public walk of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(f"{prefix}{name}")
                found += subcommands(sub, f"{prefix}{name} ")
    return found


def man_tags(page: str) -> list[str]:
    """The tag line of every ``.TP`` paragraph, without roff markup."""
    lines = page.splitlines()
    tags = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == ".TP"]
    plain = [re.sub(r"^\.B[IR]?\s+|\\f[BIRP]|\"", "", tag) for tag in tags]
    return [tag.replace("\\-", "-") for tag in plain]


def test_man_page_documents_every_command() -> None:
    tags = man_tags((ROOT / "docs" / "nodeagent.8").read_text())
    names = subcommands(cli._parser())
    assert "bundle create" in names
    for name in names:
        assert any(tag.startswith(name) for tag in tags), name


def test_udev_rule_matches_the_default_label_pattern_and_sets_the_mark() -> None:
    rule = (ROOT / "systemd" / "90-nodeagent.rules").read_text()
    assert f'ENV{{ID_FS_LABEL_ENC}}!="{DEFAULT_LABEL_PATTERN}"' in rule
    assert f'ENV{{{RULE_MARK}}}="1"' in rule
    assert 'ENV{SYSTEMD_WANTS}+="nodeagent.service"' in rule
    assert Config.default().bundles.label_pattern == DEFAULT_LABEL_PATTERN


def test_unit_runs_the_packaged_launcher_and_tmpfiles_makes_the_link_target() -> None:
    unit = (ROOT / "systemd" / "nodeagent.service").read_text()
    assert "ExecStart=/usr/bin/nodeagent run\n" in unit
    assert "ExecStartPre=/usr/bin/nodeagent render-pins --write\n" in unit
    assert "%{_bindir}/nodeagent" in SPEC.read_text()
    tmpfiles = (ROOT / "systemd" / "nodeagent.tmpfiles").read_text()
    assert f"f {Config.default().runtime.transient_dropin_path} " in tmpfiles


def test_the_path_unit_follows_every_crio_config_and_is_shipped_and_enabled() -> None:
    """Decision 0044: the files it watches are the ones nodeagent's pins restate."""
    runtime = Config.default().runtime
    path_unit = (ROOT / "systemd" / "nodeagent-foreign-pins.path").read_text()
    watched = {
        line.split("=", 1)[1] for line in path_unit.splitlines() if line.startswith("PathChanged=")
    }
    expected = {runtime.config_dir, runtime.transient_dropin_dir, runtime.config_file}
    assert watched == {str(p) for p in expected}
    assert "Unit=nodeagent-foreign-pins.service\n" in path_unit
    service = (ROOT / "systemd" / "nodeagent-foreign-pins.service").read_text()
    assert "ExecStart=/usr/bin/nodeagent render-pins --write --reload\n" in service
    assert "StartLimitIntervalSec=0\n" in service  # a burst must not stop the path unit
    assert str(Config.default().state.run_dir) in service  # the lock's directory is writable
    spec = SPEC.read_text()
    for name in ("nodeagent-foreign-pins.path", "nodeagent-foreign-pins.service"):
        assert f"systemd/{name} %{{buildroot}}%{{_unitdir}}/{name}" in spec
        assert f"%{{_unitdir}}/{name}\n" in spec
    preset = (ROOT / "packaging" / "90-nodeagent.preset").read_text()
    assert "enable nodeagent-foreign-pins.path\n" in preset


def test_the_mirror_dropin_path_unit_follows_registries_conf_and_erase_removes_the_file() -> None:
    """Decision 0058: the files it watches are the ones the node mirror's drop-in restates;
    the drop-in it writes is the one RPM erase removes (then CRI-O is reloaded)."""
    runtime = Config.default().runtime
    path_unit = (ROOT / "systemd" / "nodeagent-mirror-dropin.path").read_text()
    watched = {
        line.split("=", 1)[1] for line in path_unit.splitlines() if line.startswith("PathChanged=")
    }
    assert watched == {str(runtime.registries_conf), str(runtime.registries_dir)}
    assert "Unit=nodeagent-mirror-dropin.service\n" in path_unit
    service = (ROOT / "systemd" / "nodeagent-mirror-dropin.service").read_text()
    assert "ExecStart=/usr/bin/nodeagent render-mirror-dropin --write --reload\n" in service
    assert "StartLimitIntervalSec=0\n" in service
    assert f"ReadWritePaths=-{runtime.registries_dir}\n" in service
    spec = SPEC.read_text()
    for name in ("nodeagent-mirror-dropin.path", "nodeagent-mirror-dropin.service"):
        assert f"systemd/{name} %{{buildroot}}%{{_unitdir}}/{name}" in spec
        assert f"%{{_unitdir}}/{name}\n" in spec
    erase = spec.split("%preun", 1)[1].split("%postun", 1)[0]
    assert f"rm -f %{{_sysconfdir}}/containers/registries.conf.d/{NODE_MIRROR_DROPIN_NAME}\n" in (
        erase
    )
    assert "systemctl reload crio.service" in erase
    assert "disable --now nodeagent-mirror-dropin.path" in erase
    preset = (ROOT / "packaging" / "90-nodeagent.preset").read_text()
    assert "enable nodeagent-mirror-dropin.path\n" in preset


def test_operations_guide_explains_every_reason_code() -> None:
    """A technician who reads a reason in the journal finds it in docs/operations.md."""
    abstract = {"Permanent", "Transient", "Unknown"}
    reasons = {
        cls.reason
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.NodeAgentError)
    } - abstract
    guide = (ROOT / "docs" / "operations.md").read_text()
    assert len(reasons) > 30
    assert sorted(r for r in reasons if f"`{r}`" not in guide) == []


def test_readme_configuration_example_loads(tmp_path: Path) -> None:
    """The README's example is a valid configuration with the defaults it claims."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"## Configuration\n\n```toml\n(.*?)```", readme, re.S)
    assert found is not None
    example = tmp_path / "config.toml"
    example.write_text(found.group(1))
    config = load_config(example)
    assert sections(config) == sections(Config.default())
