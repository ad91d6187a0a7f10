"""Build ``kube-apiserver`` and ``kubectl`` from the k8s.io/kubernetes Go module, cached.

k8s.io/kubernetes is not meant to be used as a dependency: its go.mod requires
each of its "staging" modules (k8s.io/api, k8s.io/apimachinery, k8s.io/client-go,
...) at ``v0.0.0`` and replaces them with directories of its own repository
(``./staging/src/k8s.io/...``). Replace directives of a dependency are ignored,
so a module that requires k8s.io/kubernetes must itself replace every staging
module with the published tag that matches the release (``v1.33.1`` pairs with
``v0.33.1``).

The wrapper module therefore has two steps: download k8s.io/kubernetes at the
pinned version (its zip is checked against the hash pinned below), read the list
of staging modules from its go.mod, then write the wrapper's go.mod with one
``replace`` per staging module and a go.sum seeded with k8s.io/kubernetes' own,
and ``go build`` the two commands. ``go install module@version`` is not usable
here (the proxy refuses the version list, 403).

Checksums: everything that k8s.io/kubernetes' go.sum lists is verified against
it; what it cannot list (the staging modules at their published tags) is checked
against the checksum database, which the module proxy serves. Nothing of this lands
in the repository: wrapper, module cache and binaries live under
``~/.cache/nodeagent-testenv/kube-<version>/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.testenv.crio_build import CACHE_ROOT

_MODULE = "k8s.io/kubernetes"
COMMANDS = ("kube-apiserver", "kubectl")


@dataclass(frozen=True)
class KubeRelease:
    version: str
    module_hash: str
    """The go.sum ``h1:`` hash of the k8s.io/kubernetes module zip at that version."""
    go_version: str

    @property
    def staging_version(self) -> str:
        """``v1.33.1`` -> ``v0.33.1``: the tag of every staging module for this release."""
        major_minor_patch = self.version.removeprefix("v").split(".")
        return "v0." + ".".join(major_minor_patch[1:])

    @property
    def cache_dir(self) -> Path:
        return CACHE_ROOT / f"kube-{self.version}"

    def binary(self, command: str) -> Path:
        return self.cache_dir / "bin" / command

    @property
    def built(self) -> bool:
        return all(self.binary(c).exists() for c in COMMANDS)


KUBE = KubeRelease(
    version="v1.33.1",
    module_hash="h1:86+VVY/f11taZdpEZrNciLw1MIQhu6BFXf/OMFn5EUg=",
    go_version="1.24.0",
)


def _env() -> dict[str, str]:
    # GOSUMDB stays at its default: the proxy serves the checksum database, and it
    # vouches for the staging modules' tags, which no go.sum of the release lists.
    env = dict(
        os.environ,
        GOFLAGS="-mod=mod",
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",
        GOSUMDB="sum.golang.org",
    )
    for name in ("GONOSUMDB", "GOPRIVATE", "GOINSECURE"):
        env.pop(name, None)
    return env


def _go(args: list[str], cwd: Path, log: Path) -> str:
    with log.open("a") as out:
        out.write(f"$ go {' '.join(args)}\n")
        out.flush()
        result = subprocess.run(
            ["go", *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=out, check=False
        )
        out.write(result.stdout.decode(errors="replace"))
    if result.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"building Kubernetes failed at 'go {' '.join(args)}':\n{tail}")
    return result.stdout.decode()


_STAGING_REQUIRE = re.compile(r"^\s*(?:require\s+)?(k8s\.io/[A-Za-z0-9._/-]+)\s+v0\.0\.0\s*$")


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The modules k8s.io/kubernetes requires at ``v0.0.0``: its staging modules."""
    found = {
        m.group(1) for line in kubernetes_go_mod.splitlines() if (m := _STAGING_REQUIRE.match(line))
    }
    return sorted(found)


def wrapper_go_mod(release: KubeRelease, staging: list[str]) -> str:
    replaces = "".join(f"\t{m} => {m} {release.staging_version}\n" for m in staging)
    return (
        f"module nodeagent.testenv/kube\n\ngo {release.go_version}\n\n"
        f"require {_MODULE} {release.version}\n\nreplace (\n{replaces})\n"
    )


def _ldflags(release: KubeRelease) -> str:
    major, minor, _ = release.version.removeprefix("v").split(".")
    pkg = "k8s.io/component-base/version"
    return " ".join(
        [
            "-s",
            "-w",
            f"-X {pkg}.gitVersion={release.version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    )


def ensure_kube(release: KubeRelease = KUBE) -> Path:
    """Return the directory holding ``kube-apiserver`` and ``kubectl``, building on first call."""
    bin_dir = release.cache_dir / "bin"
    if release.built:
        return bin_dir
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is needed to build Kubernetes; `go` is not on PATH")
    src = release.cache_dir / "src"
    src.mkdir(parents=True, exist_ok=True)
    log = release.cache_dir / "build.log"
    seed = f"{_MODULE} {release.version} {release.module_hash}\n"

    # Step 1: fetch k8s.io/kubernetes alone (no requirement yet: its v0.0.0 ones cannot resolve).
    (src / "go.mod").write_text(f"module nodeagent.testenv/kube\n\ngo {release.go_version}\n")
    (src / "go.sum").write_text(seed)
    info = json.loads(_go(["mod", "download", "-json", f"{_MODULE}@{release.version}"], src, log))
    if info.get("Sum") != release.module_hash:
        raise RuntimeError(f"{_MODULE}@{release.version} hash {info.get('Sum')} is not pinned")
    module_dir = Path(info["Dir"])
    staging = staging_modules((module_dir / "go.mod").read_text())
    if not staging:
        raise RuntimeError(f"no v0.0.0 staging modules found in {module_dir / 'go.mod'}")

    # Step 2: the wrapper proper, every staging module replaced by its published tag.
    (src / "go.mod").write_text(wrapper_go_mod(release, staging))
    (src / "go.sum").write_text(seed + (module_dir / "go.sum").read_text())
    tmp = release.cache_dir / "bin.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    packages = [f"{_MODULE}/cmd/{c}" for c in COMMANDS]
    _go(["build", "-trimpath", "-ldflags", _ldflags(release), "-o", f"{tmp}/", *packages], src, log)
    shutil.rmtree(bin_dir, ignore_errors=True)
    tmp.rename(bin_dir)
    return bin_dir
