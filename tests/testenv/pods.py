"""Real containers in the test CRI-O (``Crio(..., pods=PodRuntime(...))``), for the tests that
need one running: check-offline's running-container findings.

What it takes, each built or found here, nothing fetched:

- ``pinns``, CRI-O's namespace pinner, compiled from the C source in CRI-O's own Go module
  (the version ``crio_build`` builds CRI-O from, already in the Go module cache), cached
  beside the ``crio`` binary;
- ``runc`` from Debian (``POD_PACKAGES``): Debian's crun 1.8 refuses the OCI spec version
  CRI-O 1.34 writes ("unknown version specified"), runc 1.1 accepts it;
- conmon from Debian (the image tests already use it);
- an image with something to run: ``sleeper_image`` holds one static binary, built with the
  C compiler, that waits until SIGTERM; it also serves as the pause image (CRI-O pulls it
  for every sandbox) — pods share the host's network (no CNI) and each container has its
  own PID namespace (no infra container);
- the CRI runtime calls nodeagent never makes (RunPodSandbox, CreateContainer …): message
  classes generated with grpcio-tools' protoc from cri-api's ``api.proto`` in the Go module
  cache (the version CRI-O requires), under another package name so they do not clash with
  nodeagent's own trimmed ``runtime_v1_pb2``; sent over nodeagent's own h2 channel.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nodeagent.adapters.cri.client import socket_path
from nodeagent.adapters.cri.h2 import Channel
from tests.testenv.crio_build import CRIO, CrioRelease
from tests.testenv.images import (
    MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_MANIFEST,
    Blob,
    BuiltImage,
    GeneratedLayer,
    LayerSpec,
    canonical_json,
)

POD_PACKAGES = ("runc",)
RUNC = Path("/usr/bin/runc")
_RUNTIME = "/runtime.v1.RuntimeService/"
_SLEEPER_C = """#include <signal.h>
#include <unistd.h>
static void stop(int signo) { (void)signo; _exit(0); }
int main(void) { signal(SIGTERM, stop); for (;;) pause(); }
"""


def go_mod_cache() -> Path:
    found = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def missing() -> str | None:
    """What keeps this machine from running pods in the test CRI-O, or None."""
    for tool in ("go", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not RUNC.exists():
        return f"{RUNC} is missing (Debian package runc)"
    return None


def ensure_pinns(release: CrioRelease = CRIO) -> Path:
    """``pinns`` built from CRI-O's module source (as its Makefile builds it), cached."""
    target = release.cache_dir / "bin" / "pinns"
    if target.exists():
        return target
    source = go_mod_cache() / f"github.com/cri-o/cri-o@{release.version}" / "pinns" / "src"
    partial = target.with_suffix(".partial")
    command = ["cc", "-std=c99", "-Os", "-Wall", "-Wextra", "-static", "-o", str(partial)]
    subprocess.run([*command, *map(str, sorted(source.glob("*.c")))], check=True)
    partial.rename(target)
    return target


def _cri_api_version(release: CrioRelease) -> str:
    go_sum = (release.cache_dir / "src" / "go.sum").read_text()
    found = re.search(r"^k8s\.io/cri-api (v[0-9.]+) h1:", go_sum, re.MULTILINE)
    if found is None:
        raise RuntimeError("CRI-O's go.sum names no k8s.io/cri-api version")
    return found[1]


def cri_messages(release: CrioRelease = CRIO) -> ModuleType:
    """The full CRI message classes (package ``testcri.v1``), generated once, cached."""
    version = _cri_api_version(release)
    directory = release.cache_dir / f"cri-api-{version}"
    module_file = directory / "testcri_pb2.py"
    if not module_file.exists():
        from grpc_tools import protoc

        proto = go_mod_cache() / f"k8s.io/cri-api@{version}/pkg/apis/runtime/v1/api.proto"
        lines = [line for line in proto.read_text().splitlines() if "gogo" not in line]
        text = "\n".join(lines).replace("package runtime.v1;", "package testcri.v1;")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "testcri.proto").write_text(text)
        args = ["protoc", f"-I{directory}", f"--python_out={directory}", "testcri.proto"]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    spec = importlib.util.spec_from_file_location("testcri_pb2", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sleeper_image(
    workdir: Path, repository: str = "nodeagent-test/sleeper", *, label: str = ""
) -> BuiltImage:
    """One layer holding ``/sleeper`` (static: no libc in the image), its entrypoint;
    ``label`` (a config label) makes another image of the same layer."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "sleeper.c").write_text(_SLEEPER_C)
    binary = workdir / "sleeper"
    command = ["cc", "-static", "-Os", "-o", str(binary), str(workdir / "sleeper.c")]
    subprocess.run(command, check=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = binary.read_bytes()
        info = tarfile.TarInfo("sleeper")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    compressed = gzip.compress(raw.getvalue(), mtime=0)
    path = workdir / "sleeper.tar.gz"
    path.write_bytes(compressed)
    digest = "sha256:" + hashlib.sha256(compressed).hexdigest()
    layer = GeneratedLayer(LayerSpec(len(compressed), 0), digest, diff_id, len(compressed), path)
    config_doc = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/sleeper"], "Labels": {"nodeagent.test": label}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config = Blob.from_bytes(MEDIA_TYPE_CONFIG, canonical_json(config_doc))
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.blob().descriptor()],
    }
    manifest = Blob.from_bytes(MEDIA_TYPE_MANIFEST, canonical_json(manifest_doc))
    platform = {"architecture": "amd64", "os": "linux"}
    return BuiltImage(repository, None, platform, config, (layer,), manifest)


@dataclass(frozen=True)
class PodRuntime:
    """What ``Crio`` needs to run pods: pinns, runc, a pause image (by digest) and its command."""

    pause_image: str
    pause_command: str = "/sleeper"
    pinns: Path | None = None

    def config_lines(self, base: Path) -> tuple[str, str]:
        """(``[crio.runtime]`` runtime table, ``[crio.image]`` pause lines) for crio.conf."""
        runtime = (
            f'[crio.runtime.runtimes.runc]\nruntime_path = "{RUNC}"\n'
            f'runtime_root = "{base}/run/runc"\nmonitor_path = "/usr/bin/conmon"\n'
        )
        pause = f'pause_image = "{self.pause_image}"\npause_command = "{self.pause_command}"'
        return runtime, pause


class Pods:
    """Pods and containers through CRI (``async with Pods(crio.endpoint) as pods``)."""

    def __init__(self, endpoint: str) -> None:
        self.pb = cri_messages()
        self._channel = Channel(socket_path(endpoint), max_message_bytes=16 << 20)
        self.sandboxes: list[str] = []

    async def __aenter__(self) -> Pods:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            for sandbox in self.sandboxes:
                await self._call(
                    "StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox)
                )
                await self._call(
                    "RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox)
                )
        finally:
            await self._channel.close()

    async def _call(self, method: str, request: Any) -> Any:
        name = method.removesuffix("Request")
        answer = await self._channel.unary(
            _RUNTIME + name, request.SerializeToString(), timeout_s=120
        )
        return getattr(self.pb, f"{name}Response").FromString(answer)

    def _namespaces(self) -> Any:
        pb = self.pb
        return pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)

    async def run(self, image: str, *, pod: str, namespace: str = "default") -> str:
        """A pod ``namespace/pod`` with one container ``app`` running ``image`` (stored
        already); the container's id."""
        pb = self.pb
        labels = {
            "io.kubernetes.pod.name": pod,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": f"uid-{pod}",
        }
        security = pb.LinuxSandboxSecurityContext(namespace_options=self._namespaces())
        sandbox_config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=pod, uid=f"uid-{pod}", namespace=namespace),
            hostname=pod,
            labels=labels,
            linux=pb.LinuxPodSandboxConfig(security_context=security),
        )
        sandbox = await self._call("RunPodSandbox", pb.RunPodSandboxRequest(config=sandbox_config))
        self.sandboxes.append(sandbox.pod_sandbox_id)
        container_security = pb.LinuxContainerSecurityContext(namespace_options=self._namespaces())
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"),
            image=pb.ImageSpec(image=image, user_specified_image=image),
            labels={**labels, "io.kubernetes.container.name": "app"},
            linux=pb.LinuxContainerConfig(security_context=container_security),
        )
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox.pod_sandbox_id, config=config, sandbox_config=sandbox_config
        )
        created = await self._call("CreateContainer", request)
        await self._call(
            "StartContainer", pb.StartContainerRequest(container_id=created.container_id)
        )
        return str(created.container_id)
