"""Build nodeagent's RPMs with rpmbuild (``make rpm``): the noarch component and its deps.

    python tools/build_rpm.py [--output DIR] [--nocheck] [--python3-pkgversion 3.11]
                              [--node-python PATH] [--dist .el9] [--component-only]
                              [--without-bundled-deps [--test-system-modules]]

1. The source tarball: every file git tracks or would track in the working tree (so
   uncommitted edits are built too), under ``nodeagent-<version>/``.
2. The wheelhouse for nodeagent-bundled-deps: ``pip download`` of the wheels locked in
   packaging/bundled-requirements.txt (hash-checked), cached under
   ``~/.cache/nodeagent-testenv/wheelhouse-<lock hash>``, so a second build downloads nothing.
3. ``rpmbuild -ba`` of packaging/nodeagent-bundled-deps.spec, then packaging/nodeagent.spec,
   in ``<output>/rpmbuild``; the binary RPMs are copied to ``<output>``.

The build runs with this interpreter (``sys.executable``: it needs pip, setuptools, pytest
and nodeagent's dependencies, as the project's .venv has), while the packaged launcher
names the interpreter on the node: ``/usr/bin/python%{python3_pkgversion}``, that is
``/usr/bin/python3`` unless ``--python3-pkgversion`` says otherwise (``3.11`` for RHEL 9,
whose python3 is 3.9), or ``--node-python`` exactly when given. The spec's
``python3_pkgversion`` also names the packages required (``python3.11-...``), so the one
option sets both: a build for RHEL 9 can no longer name 3.11 packages and a 3.9 launcher.
``--without-bundled-deps`` builds the flavour that requires the distribution's modules
(``rpmbuild --without bundled_deps``; decision 0076) and not nodeagent-bundled-deps;
``--test-system-modules`` adds tests/testenv/nodeagent-test-system-modules.spec, the
wheelhouse posing as the distribution's modules for the e2e node (TEST ONLY, labelled so).
On a machine whose rpm database is empty (Debian's rpm), BuildRequires cannot be
checked and ``--nodeps`` is passed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
LOCK = PACKAGING / "bundled-requirements.txt"
CACHE_ROOT = Path(
    os.environ.get("NODEAGENT_TESTENV_CACHE", "~/.cache/nodeagent-testenv")
).expanduser()
SPECS = ("nodeagent-bundled-deps.spec", "nodeagent.spec")
TEST_SYSTEM_MODULES = ROOT / "tests" / "testenv" / "nodeagent-test-system-modules.spec"
WHEEL_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    *("--platform", "manylinux_2_28_x86_64"),
    *("--platform", "manylinux_2_17_x86_64"),
    *("--platform", "manylinux2014_x86_64"),
    *("--abi", "cp311", "--abi", "abi3", "--abi", "none"),
]


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def spec_version(spec: Path) -> str:
    found = re.search(r"^Version:\s*(\S+)\s*$", spec.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{spec}: no Version: line")
    return found.group(1)


def source_files() -> list[str]:
    """Tracked files plus untracked ones that are not ignored, that exist now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def write_source_tarball(target: Path, version: str) -> None:
    prefix = f"nodeagent-{version}"
    with tarfile.open(target, "w:gz") as tar:
        for name in source_files():
            tar.add(ROOT / name, arcname=f"{prefix}/{name}", recursive=False)


def wheelhouse() -> Path:
    """The locked wheels, downloaded once per lock file content."""
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]
    directory = CACHE_ROOT / f"wheelhouse-{digest}"
    done = directory / ".complete"
    if done.exists():
        return directory
    partial = directory.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
    subprocess.run([*cmd, *WHEEL_FLAGS, "-r", str(LOCK), "-d", str(partial)], check=True)
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    done.touch()
    return directory


def write_wheelhouse_tarball(target: Path, wheels: Path) -> None:
    with tarfile.open(target, "w") as tar:
        for wheel in sorted(wheels.glob("*.whl")):
            tar.add(wheel, arcname=f"wheelhouse/{wheel.name}")


def rpm_db_is_empty() -> bool:
    """True where rpm does not manage the system (Debian): BuildRequires cannot be met,
    and the brp scripts are not tested with its /bin/sh."""
    result = subprocess.run(["rpm", "-qa"], capture_output=True, text=True, check=False)
    return not result.stdout.strip()


def rpmbuild(spec: Path, topdir: Path, args: argparse.Namespace) -> str:
    cmd = rpmbuild_command(spec, topdir, args)
    if rpm_db_is_empty():
        cmd.append("--nodeps")
        # Debian's brp-compress needs bash (`read -d`) but starts with #!/bin/sh (dash).
        cmd += ["--define", "__brp_compress /bin/bash %{_rpmconfigdir}/brp-compress %{?_prefix}"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = topdir / f"{spec.stem}.log"
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"rpmbuild {spec.name} failed; log: {log}\n{result.stderr[-4000:]}")
    return result.stdout


def rpmbuild_command(spec: Path, topdir: Path, args: argparse.Namespace) -> list[str]:
    """rpmbuild's command line, whatever machine it runs on."""
    cmd = ["rpmbuild", "-ba", str(spec), "--define", f"_topdir {topdir}"]
    cmd += ["--define", f"__python3 {sys.executable}"]
    if args.python3_pkgversion:
        cmd += ["--define", f"python3_pkgversion {args.python3_pkgversion}"]
    cmd += ["--define", f"nodeagent_python {node_python(args)}"]
    if args.without_bundled_deps:
        cmd += ["--without", "bundled_deps"]
    if args.dist:
        cmd += ["--define", f"dist {args.dist}"]
    if args.nocheck:
        cmd.append("--nocheck")
    return cmd


def node_python(args: argparse.Namespace) -> str:
    """The launcher's interpreter: --node-python, else the one python3_pkgversion names."""
    if args.node_python:
        return str(args.node_python)
    return "/usr/bin/python%{python3_pkgversion}"


def built_rpms(output: str) -> list[Path]:
    return [Path(m) for m in re.findall(r"^Wrote: (\S+\.rpm)$", output, re.MULTILINE)]


def build(args: argparse.Namespace) -> list[Path]:
    version = project_version()
    for spec in SPECS:
        if spec_version(PACKAGING / spec) != version:
            raise SystemExit(f"packaging/{spec} has another Version than pyproject ({version})")
    topdir = args.output.resolve() / "rpmbuild"
    shutil.rmtree(topdir, ignore_errors=True)
    sources = topdir / "SOURCES"
    sources.mkdir(parents=True)
    write_source_tarball(sources / f"nodeagent-{version}.tar.gz", version)
    write_wheelhouse_tarball(sources / f"nodeagent-wheelhouse-{version}.tar", wheelhouse())
    shutil.copy2(LOCK, sources / LOCK.name)
    rpms: list[Path] = []
    only_component = args.component_only or args.without_bundled_deps
    for spec in SPECS[-1:] if only_component else SPECS:
        rpms += built_rpms(rpmbuild(PACKAGING / spec, topdir, args))
    if args.test_system_modules:
        rpms += built_rpms(rpmbuild(TEST_SYSTEM_MODULES, topdir, args))
    copied = []
    for rpm in rpms:
        if rpm.name.endswith(".src.rpm"):
            continue
        copied.append(Path(shutil.copy2(rpm, args.output.resolve() / rpm.name)))
    return copied


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=ROOT / "build" / "rpm")
    parser.add_argument("--nocheck", action="store_true", help="skip %%check (the unit tests)")
    parser.add_argument(
        "--python3-pkgversion",
        default="",
        help="the target's python3_pkgversion (3.11 on RHEL 9); default: the spec's (3)",
    )
    parser.add_argument(
        "--node-python",
        default="",
        help="the launcher's interpreter; default /usr/bin/python%%{python3_pkgversion}",
    )
    parser.add_argument("--dist", default="", help="release suffix, e.g. .el9 (%%{dist})")
    parser.add_argument(
        "--component-only", action="store_true", help="nodeagent only, not its bundled deps"
    )
    parser.add_argument(
        "--without-bundled-deps",
        action="store_true",
        help="the flavour requiring the distribution's modules (no nodeagent-bundled-deps)",
    )
    parser.add_argument(
        "--test-system-modules",
        action="store_true",
        help="also the wheelhouse as system modules (TEST ONLY: the e2e node)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for rpm in build(args):
        print(rpm)
    print(f"built in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
