"""Render deploy/machineconfig/nodeagent.bu into a MachineConfig where ``butane`` is absent.

    python tools/render_machineconfig.py [--check] [SOURCE.bu] [--output FILE]

The subset of Butane's ``openshift`` 4.14.0 specification the source uses, and nothing else
(an unknown key is an error): ``metadata`` (name, labels), ``storage.files`` (path, mode,
overwrite, ``contents.local`` or ``contents.inline``), ``systemd.units`` (name, enabled,
``contents_local`` or ``contents``, ``dropins`` alike). ``local`` paths are read from the
repository's root (butane's ``--files-dir .``). Files are embedded as ``data:,`` URLs
(percent-encoded, never gzip'ed: butane compresses when it saves bytes; both are valid
Ignition 3.4.0). ``--check``: exit 1 when the rendered file differs from ``--output``.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "deploy" / "machineconfig" / "nodeagent.bu"
OUTPUT = ROOT / "deploy" / "machineconfig" / "50-nodeagent.yaml"
IGNITION_VERSION = "3.4.0"
"""What Butane's openshift 4.14.0 specification targets."""
HEADER = (
    "# Rendered from deploy/machineconfig/nodeagent.bu by tools/render_machineconfig.py:"
    " do not edit.\n"
)
SAFE = "/-_.~:=,;@+ "


class ButaneError(ValueError):
    """The source uses what this renderer does not know."""


def _only(node: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(node) - allowed
    if unknown:
        raise ButaneError(f"{where}: unsupported keys {sorted(unknown)}")


def _read_local(name: str, files_dir: Path) -> str:
    path = (files_dir / name).resolve()
    if files_dir.resolve() not in path.parents:
        raise ButaneError(f"{name}: outside the files directory")
    return path.read_text()


def data_url(text: str) -> str:
    return "data:," + urllib.parse.quote(text, safe=SAFE)


def _contents(node: dict[str, Any], files_dir: Path, where: str) -> str:
    if "contents_local" in node:
        return _read_local(node["contents_local"], files_dir)
    if "contents" in node:
        return str(node["contents"])
    raise ButaneError(f"{where}: no contents")


def _file(node: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    _only(node, {"path", "mode", "overwrite", "contents"}, f"file {node.get('path')}")
    contents = node["contents"]
    _only(contents, {"local", "inline"}, f"file {node['path']} contents")
    text = _read_local(contents["local"], files_dir) if "local" in contents else contents["inline"]
    return {
        "path": node["path"],
        "mode": int(node.get("mode", 0o644)),
        "overwrite": bool(node.get("overwrite", True)),
        "contents": {"source": data_url(text)},
    }


def _unit(node: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    name = node["name"]
    _only(node, {"name", "enabled", "contents", "contents_local", "dropins"}, f"unit {name}")
    unit: dict[str, Any] = {"name": name}
    if "enabled" in node:
        unit["enabled"] = bool(node["enabled"])
    unit["contents"] = _contents(node, files_dir, f"unit {name}")
    dropins = []
    for dropin in node.get("dropins", []):
        _only(dropin, {"name", "contents", "contents_local"}, f"drop-in of {name}")
        contents = _contents(dropin, files_dir, f"drop-in {dropin['name']}")
        dropins.append({"name": dropin["name"], "contents": contents})
    if dropins:
        unit["dropins"] = dropins
    return unit


def render(source: Path, files_dir: Path) -> dict[str, Any]:
    doc = yaml.safe_load(source.read_text())
    _only(doc, {"variant", "version", "metadata", "storage", "systemd"}, "top level")
    if (doc["variant"], doc["version"]) != ("openshift", "4.14.0"):
        raise ButaneError("only variant openshift, version 4.14.0")
    _only(doc["metadata"], {"name", "labels"}, "metadata")
    _only(doc.get("storage", {}), {"files"}, "storage")
    _only(doc.get("systemd", {}), {"units"}, "systemd")
    files = [_file(f, files_dir) for f in doc.get("storage", {}).get("files", [])]
    units = [_unit(u, files_dir) for u in doc.get("systemd", {}).get("units", [])]
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": doc["metadata"]["name"], "labels": doc["metadata"]["labels"]},
        "spec": {
            "config": {
                "ignition": {"version": IGNITION_VERSION},
                "storage": {"files": files},
                "systemd": {"units": units},
            }
        },
    }


def dump(machine_config: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(machine_config, sort_keys=False, width=4096)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=SOURCE)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--files-dir", type=Path, default=ROOT)
    parser.add_argument("--check", action="store_true", help="compare with --output only")
    args = parser.parse_args(argv)
    text = dump(render(args.source, args.files_dir))
    if args.check:
        same = args.output.exists() and args.output.read_text() == text
        print(f"{args.output}: {'up to date' if same else 'differs: re-render it'}")
        return 0 if same else 1
    args.output.write_text(text)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
