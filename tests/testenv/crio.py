"""Run a private CRI-O for tests: every setting in files, vfs storage, cgroupfs, a temp root.

The layout under ``base`` (a temp dir the caller owns)::

    etc/crio.conf              main config: every setting the runtime needs
    etc/crio.conf.d/           plays the part of /etc/crio/crio.conf.d
    etc/registries.conf(.d/)   CONTAINER_REGISTRIES_CONF(_DIR): survive reloads
    etc/storage.conf           CONTAINERS_STORAGE_CONF
    etc/policy.json            accepts every image (test registry only), or ``policy``
    home/                      the runtime's $HOME: home/.config/containers/registries.d is
                               the registries.d it reads (``registries_d_dir``), and
                               home/.config/containers/certs.d the certs.d it tries first
                               (``certs_d_dir``), before the host's /etc/containers/certs.d
    run/crio.sock              the CRI socket
    lib/, run/                 root and runroot of containers-storage
    crio.log                   the runtime's log

A reload (SIGHUP) rebuilds the configuration from files only, so nothing is
passed on the command line except the two paths of the files themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nodeagent.adapters.cri.client import CriClient
from nodeagent.errors import NodeAgentError
from tests.testenv.crio_build import ensure_crio
from tests.testenv.pods import PodRuntime, ensure_pinns
from tests.testenv.waiting import log_tail, wait_for

PINNS_PLACEHOLDER = """#!/bin/sh
# nodeagent test environment: CRI-O requires a pinns binary to start, but only
# runs it when it creates a pod sandbox. Image tests never do.
echo "pinns placeholder: pod sandboxes are not supported in this test runtime" >&2
exit 1
"""


def _toml_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def answers_version(endpoint: str, *, timeout_s: float = 2.0) -> bool:
    """Whether the runtime at ``endpoint`` answers CRI ``Version`` (nodeagent's own client).

    Runs in a thread of its own with its own event loop: ``Crio.start`` is also
    called from async tests, whose loop is running in this thread.
    """

    async def probe() -> bool:
        async with CriClient(endpoint, timeout_s=timeout_s) as client:
            try:
                await client.version()
            except NodeAgentError:
                return False
        return True

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, probe()).result()


class Crio:
    """One CRI-O process with its own files; ``start``/``stop``/``reload``/``kill``."""

    def __init__(
        self,
        base: Path,
        *,
        insecure_registries: Iterable[str] = (),
        storage_root: Path | None = None,
        staging_dir: Path | None = None,
        image_settings: str = "",
        command_prefix: Sequence[str] = (),
        policy: Mapping[str, Any] | None = None,
        registries_d: Mapping[str, str] | None = None,
        pods: PodRuntime | None = None,
    ) -> None:
        self.base = base
        self.pods = pods
        """Run real pods (``tests/testenv/pods.py``: pinns, runc, a pause image); None: the
        image-only runtime with a placeholder pinns."""
        self.command_prefix = list(command_prefix)
        """Prepended to CRI-O's command: ``ip netns exec <node>`` runs it in a site node's
        network namespace (``tests/testenv/site_node.py``); its socket is a file, reachable
        from here all the same."""
        self.etc = base / "etc"
        self.config_file = self.etc / "crio.conf"
        self.dropin_dir = self.etc / "crio.conf.d"
        self.registries_conf = self.etc / "registries.conf"
        self.registries_dir = self.etc / "registries.conf.d"
        self.storage_conf = self.etc / "storage.conf"
        self.socket = base / "run" / "crio.sock"
        self.storage_root = storage_root or base / "lib" / "containers"
        self.pid_file = base / "crio.pid"
        self.log_path = base / "crio.log"
        self.insecure_registries = list(insecure_registries)
        self.staging_dir = staging_dir or base / "tmp"
        """``big_files_temporary_dir``: where pulls stage blobs (not this machine's /var/tmp,
        which other runtimes share)."""
        self.image_settings = image_settings
        """More ``[crio.image]`` lines (e.g. ``pull_progress_timeout = "10s"``)."""
        self.policy = dict(policy or {"default": [{"type": "insecureAcceptAnything"}]})
        """policy.json (containers-policy.json(5)); default: every image accepted."""
        self.home = base / "home"
        self.registries_d_dir = self.home / ".config" / "containers" / "registries.d"
        """containers/image reads this registries.d (under $HOME) instead of the host's."""
        self.certs_d_dir = self.home / ".config" / "containers" / "certs.d"
        """containers-certs.d(5) under $HOME: containers/image tries it before /etc's, so a
        test's CA and client certificates stay in the test's directory."""
        self.registries_d = dict(registries_d or {})
        """registries.d files (name → YAML text) written with the other files."""
        self.process: subprocess.Popen[bytes] | None = None
        self.binary = ensure_crio()

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    # ------------------------------------------------------------ files
    def write_files(self) -> None:
        for d in ("etc/crio.conf.d", "etc/registries.conf.d", "run", "lib", "log", "empty", "bin"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        pinns = self.base / "bin" / "pinns"
        if self.pods is not None:
            shutil.copy(self.pods.pinns or ensure_pinns(), pinns)
        else:
            pinns.write_text(PINNS_PLACEHOLDER)
        pinns.chmod(0o755)
        (self.etc / "policy.json").write_text(json.dumps(self.policy))
        self.registries_d_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.registries_d.items():
            (self.registries_d_dir / name).write_text(text)
        self.storage_conf.write_text(
            f'[storage]\ndriver = "vfs"\nrunroot = "{self.base}/run/storage"\n'
            f'graphroot = "{self.storage_root}"\n'
        )
        self.write_registries()
        self.config_file.write_text(self.render_config())

    def write_registries(self) -> None:
        lines = ["unqualified-search-registries = []", 'short-name-mode = "disabled"', ""]
        for host in self.insecure_registries:
            lines += ["[[registry]]", f'location = "{host}"', "insecure = true", ""]
        self.registries_conf.write_text("\n".join(lines))

    def render_config(self) -> str:
        b = self.base
        runtime, runc, pause = "crun", "", 'pause_image = "localhost/nodeagent-test/pause:none"'
        if self.pods is not None:
            runtime = "runc"
            runc, pause = self.pods.config_lines(b)
        return f"""# nodeagent test runtime: all settings live here (a reload drops CLI flags)
[crio]
root = "{self.storage_root}"
runroot = "{b}/run/storage"
storage_driver = "vfs"
log_dir = "{b}/log/pods"
version_file = "{b}/run/version"
version_file_persist = "{b}/lib/version"
clean_shutdown_file = "{b}/lib/clean.shutdown"

[crio.api]
listen = "{self.socket}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "{runtime}"
conmon = "/usr/bin/conmon"
conmon_cgroup = "pod"
cgroup_manager = "cgroupfs"
decryption_keys_path = "{b}/etc/keys"
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"
hooks_dir = []
cdi_spec_dirs = []
container_exits_dir = "{b}/run/exits"
container_attach_socket_dir = "{b}/run"
namespaces_dir = "{b}/run/ns"
pinns_path = "{b}/bin/pinns"
enable_criu_support = false
log_level = "info"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_root = "{b}/run/crun"
monitor_path = "/usr/bin/conmon"

{runc}
[crio.image]
signature_policy = "{b}/etc/policy.json"
signature_policy_dir = "{b}/etc/policies"
{pause}
pinned_images = []
big_files_temporary_dir = "{self.staging_dir}"
{self.image_settings}

[crio.network]
network_dir = "{b}/empty"
plugin_dirs = {_toml_list([str(b / "empty")])}

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""

    # ------------------------------------------------------------ process
    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            CONTAINER_REGISTRIES_CONF=str(self.registries_conf),
            CONTAINER_REGISTRIES_CONF_DIR=str(self.registries_dir),
            CONTAINERS_STORAGE_CONF=str(self.storage_conf),
            HOME=str(self.home),
        )

    def start(self, *, timeout_s: float = 60.0) -> None:
        if not self.config_file.exists():
            self.write_files()
        log = self.log_path.open("ab")
        cmd = [*self.command_prefix, str(self.binary), "--config", str(self.config_file)]
        cmd += ["--config-dir", str(self.dropin_dir)]
        # The pid file is what a daemon under test signals to reload CRI-O (SIGHUP): it is
        # written once CRI-O answers, as its unit's is, since a SIGHUP before CRI-O has set
        # its handler ends it (seen: a restore's reload killed a CRI-O still starting).
        self.pid_file.unlink(missing_ok=True)
        self.process = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env())
        log.close()
        wait_for(
            self._answers_version,
            timeout_s=timeout_s,
            interval_s=0.1,
            what=f"CRI-O to answer Version on {self.socket}",
            detail=lambda: log_tail(self.log_path),
        )
        self.pid_file.write_text(f"{self.process.pid}\n")

    def _answers_version(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"CRI-O exited with code {self.process.returncode} during start\n"
                + log_tail(self.log_path)
            )
        if not self.socket.exists():
            return False
        return answers_version(self.endpoint)

    def reload(self, *, timeout_s: float = 30.0) -> None:
        """SIGHUP the runtime and wait for it to log the outcome of that reload."""
        assert self.process is not None, "runtime not started"
        offset = self.log_path.stat().st_size
        self.process.send_signal(signal.SIGHUP)

        def outcome() -> str | None:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            if "Unable to reload configuration" in text:
                raise RuntimeError("CRI-O refused the reload\n" + text[-4000:])
            return "done" if "Configuration reload completed" in text else None

        wait_for(
            outcome,
            timeout_s=timeout_s,
            what="CRI-O to finish its reload",
            detail=lambda: log_tail(self.log_path),
        )

    def stop(self, *, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL when it does not exit in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: an unclean stop, as a crash would leave it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def cleanup(self) -> None:
        """Stop the runtime and remove everything it created under ``base``."""
        self.stop()
        _unmount_below(self.base)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Crio:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()


def _unmount_below(base: Path) -> None:
    """Unmount anything the runtime left mounted under ``base`` (deepest first)."""
    prefix = str(base.resolve()) + "/"
    with Path("/proc/self/mounts").open() as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
