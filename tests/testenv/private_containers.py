"""Debian's podman and skopeo on a test CRI-O's containers-storage, touching nothing of the host.

`PrivateContainers(base, storage_conf)` runs a command in a private mount namespace where
`base/etc` is on /etc/containers (a permissive policy.json, an empty registries.conf, a
containers.conf without an events log), `base/run` on /run (podman's tmp_dir is
/run/libpod) and `base/var` on /var/lib/containers (containers/image's blob-info cache of
root), with `CONTAINERS_STORAGE_CONF` naming the CRI-O's storage.conf: the same graphroot,
runroot and driver CRI-O uses, as on a node where podman and CRI-O share
/var/lib/containers/storage. Every file written lands under `base` or under the CRI-O's
own root (podman's libpod database in the graphroot).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

POLICY = '{"default": [{"type": "insecureAcceptAnything"}]}\n'
REGISTRIES = "unqualified-search-registries = []\n"
CONTAINERS_CONF = '[engine]\nevents_logger = "none"\n'
_SCRIPT = (
    'mount --bind "$NA_ETC" /etc/containers && mount --bind "$NA_RUN" /run && '
    'if [ -d /var/lib/containers ]; then mount --bind "$NA_VAR" /var/lib/containers; '
    'else mount -t tmpfs nodeagent-test /var/lib; fi && exec "$@"'
)


class PrivateContainers:
    def __init__(self, base: Path, storage_conf: Path) -> None:
        self.base = base
        self.storage_conf = storage_conf
        self.etc, self.run_dir, self.var, self.home = (
            base / n for n in ("etc", "run", "var", "home")
        )
        for directory in (self.etc, self.run_dir, self.var, self.home):
            directory.mkdir(parents=True, exist_ok=True)
        (self.etc / "policy.json").write_text(POLICY)
        (self.etc / "registries.conf").write_text(REGISTRIES)
        (self.etc / "containers.conf").write_text(CONTAINERS_CONF)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERS_")}
        env.pop("REGISTRY_AUTH_FILE", None)
        env.pop("XDG_RUNTIME_DIR", None)
        return env | {
            "HOME": str(self.home),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "NA_ETC": str(self.etc),
            "NA_RUN": str(self.run_dir),
            "NA_VAR": str(self.var),
        }

    def command(self, args: Sequence[str]) -> list[str]:
        """`args` wrapped: the private namespace set up, then `args` exec'ed."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SCRIPT, "sh",
                *args]  # fmt: skip

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(args), env=self.env(), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
