"""Run the real ``nodeagent run`` daemon against a test CRI-O, with every path in a temp dir."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.testenv.crio import Crio
from tests.testenv.udev import TEST_MEDIA_CONFIG, TEST_SESSION_CONFIG
from tests.testenv.waiting import log_tail, wait_for


class Agent:
    """A nodeagent daemon process plus its config, spec dirs and state dir under ``base``."""

    def __init__(
        self,
        base: Path,
        crio: Crio,
        *,
        extra_config: str = "",
        pull_settings: str = "",
        watch_media: bool = False,
        is_fast_retry: bool = True,
    ) -> None:
        self.base = base
        self.crio = crio
        self.config_file = base / "etc" / "nodeagent" / "config.toml"
        self.persistent_dir = base / "etc" / "nodeagent" / "pinnedimagesets.d"
        self.transient_dir = base / "run" / "nodeagent" / "pinnedimagesets.d"
        self.transient_dropin_dir = base / "run" / "crio" / "crio.conf.d"
        self.state_dir = base / "state"
        self.auth_file = base / "auth.json"
        self.log_path = base / "nodeagent.log"
        self.extra_config = extra_config
        self.pull_settings = pull_settings
        self.watch_media = watch_media
        self.is_fast_retry = is_fast_retry
        """Pull retries after 0.2 to 1 s (tests stay short); False keeps the daemon's defaults,
        for the fault drills that hold a fault against the real retry schedule."""
        self.trusted_keys_dir = base / "etc" / "nodeagent" / "trusted-keys.d"
        self.media_dir = base / "run" / "nodeagent" / "media"
        self.run_dir = base / "run" / "nodeagent"
        self.mirror_auth_file = base / "run" / "containers" / "0" / "auth.json"
        """``[mirror] auth_file``: where the daemon adds the node mirror's credential."""
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.extra_env: dict[str, str] = {}
        self.umask: int | None = None
        """The daemon's umask (None: this process's); the unit's is 0027."""
        self.python = sys.executable
        """The interpreter that runs nodeagent (the benchmark uses a runtime-only venv)."""

    def write_config(self) -> None:
        for d in (self.persistent_dir, self.transient_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        c = self.crio
        backoff = "backoff_initial_s = 0.2\nbackoff_max_s = 1.0" if self.is_fast_retry else ""
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            f"""[runtime]
endpoint = "{c.endpoint}"
config_file = "{c.config_file}"
config_dir = "{c.dropin_dir}"
transient_dropin_dir = "{self.transient_dropin_dir}"
pid_file = "{c.pid_file}"
registries_conf = "{c.registries_conf}"
registries_dir = "{c.registries_dir}"
registries_d_dir = "{c.registries_d_dir}"
certs_dirs = ["{c.certs_d_dir}"]
reload_timeout_s = 30.0

[specs]
dirs = ["{self.persistent_dir}", "{self.transient_dir}"]

[pull]
auth_file = "{self.auth_file}"
{backoff}
{self.pull_settings}

[disk]
reserve_bytes = "16MiB"
reserve_percent = 0.0

[state]
dir = "{self.state_dir}"
run_dir = "{self.run_dir}"

[bundles]
watch_media = {"true" if self.watch_media else "false"}
trusted_keys_dir = "{self.trusted_keys_dir}"
media_dir = "{self.media_dir}"
{TEST_MEDIA_CONFIG}
{TEST_SESSION_CONFIG}
{self.extra_config}
"""
        )
        # The node mirror's root auth file under the test's directory, never the host's
        # /run/containers/0/auth.json (a drop-in: a test's own [mirror] table stays legal).
        dropin = self.config_file.parent / "config.d" / "00-test-mirror.toml"
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text(f'[mirror]\nauth_file = "{self.mirror_auth_file}"\n')

    def env(self) -> dict[str, str]:
        # No systemd on this machine's system bus: the reload takes the SIGHUP path.
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=f"unix:path={self.base}/no-bus")
        # A daemon that outlasts its stop bound is sent SIGABRT: every thread's stack goes
        # to the log, so the failure says what it was still doing.
        env["PYTHONFAULTHANDLER"] = "1"
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
            env.pop(name, None)
        return env | self.extra_env

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [self.python, "-m", "nodeagent", "--config", str(self.config_file), *args]
        self.base.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            cmd, capture_output=True, text=True, env=self.env(), check=False, cwd=self.base
        )

    def start(self) -> None:
        if not self.config_file.exists():
            self.write_config()
        self.runs += 1
        with self.log_path.open("ab") as log:
            log.write(f"----- run {self.runs} -----\n".encode())
            log.flush()
            cmd = [self.python, "-m", "nodeagent", "--config", str(self.config_file), "run"]
            # cwd: ``-m`` puts it first on sys.path, and nodeagent must come from
            # ``self.python``'s environment (the benchmark compares installed versions),
            # not from a checkout that happens to be the current directory.
            self.process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=log,
                env=self.env(),
                cwd=self.base,
                umask=-1 if self.umask is None else self.umask,
            )

    def stop(self, *, timeout_s: float | None = None) -> int:
        """SIGTERM, then wait for the exit: within the unit's ``TimeoutStopSec=`` (systemd's
        bound before it kills; a pull or a store copy in flight finishes its step first)."""
        timeout_s = unit_stop_timeout_s() if timeout_s is None else timeout_s
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)  # faulthandler: the threads' stacks
            self.process.wait(timeout=10)
            self.process = None
            raise AssertionError(
                f"nodeagent did not exit within {timeout_s:.0f} s of SIGTERM\n"
                f"{log_tail(self.log_path, max_bytes=20000)}"
            ) from None
        self.process = None
        return code

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def current_run_log(self) -> str:
        return self.log_text().rsplit(f"----- run {self.runs} -----\n", 1)[-1]

    def status(self) -> dict[str, Any] | None:
        path = self.state_dir / "status.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):  # absent, or not a file (a drill damaged it)
            return None

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], *, what: str, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(
                    f"nodeagent exited with {self.process.returncode}\n{log_tail(self.log_path)}"
                )
            status = self.status()
            return status if status is not None and predicate(status) else None

        return wait_for(
            check,
            timeout_s=timeout_s,
            interval_s=0.1,
            what=what,
            detail=lambda: f"status: {self.status()}\n{log_tail(self.log_path)}",
        )

    def wait_log(self, needle: str, *, timeout_s: float = 120.0) -> None:
        wait_for(
            lambda: needle in self.current_run_log(),
            timeout_s=timeout_s,
            what=f"{needle!r} in nodeagent's log",
            detail=lambda: log_tail(self.log_path),
        )

    def write_set(self, name: str, refs: list[str], *, is_persistent: bool = True) -> Path:
        directory = self.persistent_dir if is_persistent else self.transient_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.yaml"
        path.write_text(pinned_image_set_yaml(name, refs))
        return path

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()


def pinned_image_set_yaml(name: str, refs: list[str]) -> str:
    images = "\n".join(f"    - name: {ref}" for ref in refs)
    return f"""apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: {name}
spec:
  pinnedImages:
{images}
"""


def set_status(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in status.get("pinnedImageSets", []):
        if item["name"] == name:
            return dict(item)
    return None


def set_state(status: dict[str, Any], name: str) -> str | None:
    found = set_status(status, name)
    return None if found is None else str(found["state"])


def unit_stop_timeout_s() -> float:
    """``TimeoutStopSec=`` of systemd/nodeagent.service, in seconds (``60s`` or ``60``)."""
    unit = (Path(__file__).resolve().parents[2] / "systemd" / "nodeagent.service").read_text()
    found = re.search(r"^TimeoutStopSec=(\d+)s?$", unit, re.MULTILINE)
    if found is None:
        raise AssertionError("systemd/nodeagent.service has no TimeoutStopSec= in seconds")
    return float(found.group(1))
