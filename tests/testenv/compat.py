"""``make compat``: the suites at the edges of what pyproject allows (issue 29 item 4).

Two runs, each printing the versions it ran with:

``lowest``
    Python 3.11 (the oldest ``requires-python`` allows) with every runtime dependency at the
    lower bound pyproject states (``>=X`` pinned to ``==X`` in a constraints file made from
    ``[project] dependencies``), the development tools at their current versions. It runs the
    unit, service and HTTP suites (``tests/integration/adapters/http``: the peer server and
    the mirror subclass aiohttp's server hooks and asyncio's ``SSLProtocol``, so they are what
    an older aiohttp would break), and the metrics endpoint (prometheus_client's exposition
    API at its bound). The virtualenv is cached under
    ``~/.cache/nodeagent-testenv/compat/lowest-<key>`` (``NODEAGENT_TESTENV_CACHE``), keyed
    by the constraints.
``debian13``
    Debian 13's own ``python3`` (3.13) in a root made by debootstrap
    (``tests/testenv/rootfs.py``, suite trixie, cached), run under ``systemd-nspawn`` with the
    current dependencies from PyPI (the lowest aiohttp has no wheels for 3.13), over a copy
    of the working tree. It runs the unit and service suites (the HTTP suite needs the test
    peers, CRI-O built with Go among them, which the root does not have).

``make compat`` runs both (about 6 minutes once cached, 10 the first time);
``tests/compat/test_lowest.py`` runs the service and HTTP suites of ``lowest`` inside ``make
test`` (the fast part). The exit status is the first failing run's::

    .venv/bin/python -m tests.testenv.compat                 # both
    .venv/bin/python -m tests.testenv.compat lowest -- -x    # pytest options after --
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement

from tests.testenv.crio_build import CACHE_ROOT
from tests.testenv.rootfs import rootfs_tarball, unpack

REPO = Path(__file__).resolve().parents[2]
COMPAT = CACHE_ROOT / "compat"
PYTHON_311 = os.environ.get("NODEAGENT_PYTHON311", shutil.which("python3.11") or "python3.11")
LOWEST_SUITES = (
    "tests/unit",
    "tests/service",
    "tests/integration/adapters/http",
    "tests/integration/adapters/test_metrics_endpoint.py",  # prometheus_client's exposition
)
DEBIAN_SUITES = ("tests/unit", "tests/service")
DEBIAN_SUITE = "trixie"
DEBIAN_PACKAGES = (
    "python3", "python3-venv", "python3-pip", "ca-certificates", "libudev1", "procps", "mount",
    "git", "udev",  # tools/fuzz_report.py lists the tree with git; the udev probe asks udevadm
)  # fmt: skip
PYTEST = ("-q", "-p", "no:cacheprovider", "--color=no")


def project() -> dict[str, object]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    found: dict[str, object] = doc["project"]
    return found


def lowest_constraints() -> list[str]:
    """``name==X`` for each runtime dependency's ``>=X``; a dependency without one is an error
    (its lowest version would be whatever pip picks, so nothing would be tested)."""
    pins = []
    for text in project()["dependencies"]:  # type: ignore[attr-defined]
        requirement = Requirement(text)
        lower = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if not lower:
            raise SystemExit(f"compat: {text!r} in pyproject has no lower bound to test at")
        pins.append(f"{requirement.name}=={lower[0]}")
    return pins


def dev_requirements() -> list[str]:
    extras: dict[str, list[str]] = project()["optional-dependencies"]  # type: ignore[assignment]
    return list(extras["dev"])


def _key(*parts: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(x for p in parts for x in p).encode()).hexdigest()[:12]


def lowest_venv() -> Path:
    """The cached virtualenv of Python 3.11 with the runtime dependencies at their bounds."""
    pins, dev = lowest_constraints(), dev_requirements()
    venv = COMPAT / f"lowest-{_key(pins, dev, [PYTHON_311])}"
    if (venv / ".installed").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([PYTHON_311, "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "-c", str(constraints), *pins, *dev], check=True)
    (venv / ".installed").touch()
    return venv


def versions(python: Sequence[str], env: dict[str, str] | None = None) -> str:
    names = [Requirement(t).name for t in project()["dependencies"]]  # type: ignore[attr-defined]
    probe = (
        "import importlib.metadata as m, sys\n"
        f"names = {names!r}\n"
        "print('Python', sys.version.split()[0] + ';', "
        "', '.join(f'{n} {m.version(n)}' for n in names))"
    )
    done = subprocess.run(
        [*python, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    return done.stdout.strip() or done.stderr.strip()[-400:]


def run_lowest(extra: Sequence[str]) -> int:
    venv = lowest_venv()
    python = [str(venv / "bin" / "python")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print(f"compat lowest: {versions(python, env)}", flush=True)
    command = [*python, "-m", "pytest", *PYTEST, *LOWEST_SUITES, *extra]
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


def debian_root() -> Path:
    """The unpacked Debian 13 root with a virtualenv of the current dependencies."""
    tarball = rootfs_tarball(DEBIAN_SUITE, DEBIAN_PACKAGES)
    requirements = [*project()["dependencies"], *dev_requirements()]  # type: ignore[misc]
    root = COMPAT / f"{DEBIAN_SUITE}-{_key([tarball.name], requirements)}"
    if (root / ".installed").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    unpack(root, tarball)
    (root / "requirements.txt").write_text("\n".join(requirements) + "\n")
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    script = "python3 -m venv /venv && /venv/bin/pip install --quiet -r /requirements.txt"
    # PyPI as this machine reaches it: through the host's CA bundle (a proxy's CA may be in it)
    bundle = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    install = nspawn(root, ["/bin/sh", "-c", script], {"PIP_CERT": "/host-ca.crt"})
    install.insert(1, f"--bind-ro={bundle}:/host-ca.crt")
    subprocess.run(install, check=True)
    (root / ".installed").touch()
    return root


def nspawn(
    root: Path, command: Sequence[str], env: dict[str, str] | None = None, chdir: str = "/"
) -> list[str]:
    """A command in the root under systemd-nspawn (not booted; the host's network, which the
    virtualenv's install needs to reach PyPI; ``--keep-unit`` as tests/testenv/nspawn.py)."""
    options = [f"--setenv={k}={v}" for k, v in (env or {}).items()]
    return [
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit", f"--directory={root}",
        "--resolv-conf=off", "--timezone=off", "--link-journal=no", f"--chdir={chdir}",
        *options, *command,
    ]  # fmt: skip


def copy_tree(target: Path) -> None:
    """The working tree as git sees it (tracked and untracked, ignored files left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    shutil.rmtree(target, ignore_errors=True)
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            (target / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / os.fsdecode(name))


def run_debian(extra: Sequence[str]) -> int:
    root = debian_root()
    copy_tree(root / "src")
    env = {"PYTHONPATH": "/src", "NODEAGENT_COMPAT": "debian13", "HOME": "/root"}
    print(f"compat debian13: {versions(nspawn(root, ['/venv/bin/python'], env))}", flush=True)
    command = ["/venv/bin/python", "-m", "pytest", *PYTEST, *DEBIAN_SUITES, *extra]
    return subprocess.run(nspawn(root, command, env, chdir="/src"), check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv.compat", description=__doc__)
    parser.add_argument("run", nargs="?", choices=("lowest", "debian13", "all"), default="all")
    parser.add_argument("pytest_args", nargs="*", help="after --: given to pytest")
    args = parser.parse_args(argv)
    runs = {"lowest": run_lowest, "debian13": run_debian}
    chosen = list(runs) if args.run == "all" else [args.run]
    codes = [runs[name](args.pytest_args) for name in chosen]
    for name, code in zip(chosen, codes, strict=True):
        print(f"compat {name}: {'passed' if code == 0 else f'FAILED (pytest exit {code})'}")
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
