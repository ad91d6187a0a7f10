"""deploy/machineconfig/: the rendered MachineConfig is the Butane source's content
(tools/render_machineconfig.py; no butane binary here), and installs the container
variant's units, the configuration, both key sets and the host-side image tools."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testenv.agent_image import load_tool
from tests.unit.container import ROOT

render_machineconfig = load_tool("render_machineconfig")
SOURCE = ROOT / "deploy/machineconfig/nodeagent.bu"
RENDERED = ROOT / "deploy/machineconfig/50-nodeagent.yaml"


@pytest.fixture(scope="module")
def machine_config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RENDERED.read_text())
    return doc


def test_the_committed_rendering_is_up_to_date() -> None:
    rendered = render_machineconfig.dump(render_machineconfig.render(SOURCE, ROOT))
    assert RENDERED.read_text() == rendered, "re-render: python tools/render_machineconfig.py"


def test_every_file_carries_its_source_bytes_and_mode(machine_config: dict[str, Any]) -> None:
    source = yaml.safe_load(SOURCE.read_text())
    files = {f["path"]: f for f in machine_config["spec"]["config"]["storage"]["files"]}
    assert len(files) == len(source["storage"]["files"])
    for entry in source["storage"]["files"]:
        rendered = files[entry["path"]]
        url = rendered["contents"]["source"]
        assert url.startswith("data:,")
        text = urllib.parse.unquote(url.removeprefix("data:,"))
        assert text == (ROOT / entry["contents"]["local"]).read_text(), entry["path"]
        assert rendered["mode"] == entry["mode"]


def test_units_are_the_container_variants(machine_config: dict[str, Any]) -> None:
    units = {u["name"]: u for u in machine_config["spec"]["config"]["systemd"]["units"]}
    for name in ("nodeagent.service", "nodeagent-peer.service", "nodeagent-image-load.service"):
        assert units[name]["contents"] == (ROOT / "systemd/container" / name).read_text()
    assert "--sdnotify=container" in units["nodeagent.service"]["contents"]
    assert units["nodeagent.service"]["enabled"] is True
    assert units["nodeagent-image-health.timer"]["enabled"] is True
    (dropin,) = units["nodeagent.service"]["dropins"]
    assert re.search(r"^Environment=NODEAGENT_IMAGE_PINNED=sha256:[0-9a-f]{64}$",
                     dropin["contents"], re.MULTILINE)  # fmt: skip


def test_keys_for_bundles_and_for_agent_images_are_separate_sets(
    machine_config: dict[str, Any],
) -> None:
    paths = [f["path"] for f in machine_config["spec"]["config"]["storage"]["files"]]
    assert any(p.startswith("/etc/nodeagent/trusted-keys.d/") for p in paths)
    assert any(p.startswith("/etc/nodeagent/image-keys.d/") for p in paths)
    # Host scripts go where RHCOS lets a MachineConfig write (/usr is read-only there).
    scripts = [p for p in paths if "libexec" in p or p.endswith("/bin/nodeagent")]
    assert scripts and all(p.startswith("/usr/local/") for p in scripts)
    units = (ROOT / "systemd/container/nodeagent.service").read_text()
    assert "/usr/local/libexec/nodeagent/nodeagent-image-select" in units


def test_an_unknown_butane_key_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "x.bu"
    source.write_text(SOURCE.read_text().replace("storage:\n", "passwd: {}\nstorage:\n", 1))
    with pytest.raises(render_machineconfig.ButaneError, match="passwd"):
        render_machineconfig.render(source, ROOT)


def test_every_rpm_unit_has_its_counterpart_installed(machine_config: dict[str, Any]) -> None:
    """Each unit the RPM installs is in the MachineConfig: its container counterpart
    (systemd/container/) where it runs nodeagent, else the RPM's own bytes (sockets, paths:
    systemd alone runs them). None runs /usr/bin/nodeagent, which RHCOS does not have."""
    units = {u["name"]: u["contents"] for u in machine_config["spec"]["config"]["systemd"]["units"]}
    rpm_units = [
        p for p in (ROOT / "systemd").iterdir() if p.suffix in {".service", ".socket", ".path"}
    ]
    assert len(rpm_units) >= 10
    for path in rpm_units:
        counterpart = ROOT / "systemd/container" / path.name
        assert path.name in units, f"{path.name}: not installed by the MachineConfig"
        expected = counterpart if counterpart.exists() else path
        assert units[path.name] == expected.read_text(), path.name
        assert not re.search(r"^Exec\w*=\S*/usr/bin/nodeagent\b", units[path.name], re.M), path
