"""nodeagent's own image for the container variant's tests: a tiny signed OCI archive made
with tools/build_image.py's functions, an Ed25519 key of the agent image keys made with
openssl (the node's tool), and the host-side loader (systemd/container/nodeagent-image-load)
run against a private podman storage in the test's directory."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
LOADER = ROOT / "systemd" / "container" / "nodeagent-image-load"


def build_image_tool() -> ModuleType:
    """tools/build_image.py (a script, not a package) as a module."""
    return load_tool("build_image")


def load_tool(name: str) -> ModuleType:
    """A script of tools/ (not a package) as a module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def ed25519_key(directory: Path, name: str) -> tuple[Path, Path]:
    """(private, public) PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{name}.key", directory / f"{name}.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True
    )
    cmd = ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)]
    subprocess.run(cmd, check=True)
    return private, public


@dataclass(frozen=True)
class SignedArchive:
    archive: Path
    digest: str
    statement: Path


def tiny_archive(
    directory: Path, key: Path, version: str = "9.9.9", sequence: int = 1000
) -> SignedArchive:
    """A one-layer image (a text file: never run, only loaded) as a signed oci-archive in
    ``directory``/nodeagent-image/, as a stick carries it."""
    tool = build_image_tool()
    tree = directory / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/nodeagent-image-test").write_text(f"version {version}\n")
    layer = tool.make_layer(tree, 1_700_000_000)
    config = tool.canonical_json(tool.image_config([layer], 1_700_000_000, version))
    layout = directory / "layout"
    digest: str = tool.write_layout(layout, [layer], config, version)
    stick = directory / "stick" / "nodeagent-image"
    stick.mkdir(parents=True)
    archive = stick / f"nodeagent-{version}.oci.tar"
    tool.write_archive(layout, archive, 1_700_000_000)
    statement: Path = tool.sign_archive(archive, digest, key, sequence=sequence, version=version)
    return SignedArchive(archive=archive, digest=digest, statement=statement)


def tiny_layout(directory: Path, version: str) -> tuple[Path, str]:
    """A one-layer image (a text file) as an OCI layout: (layout, manifest digest)."""
    tool = build_image_tool()
    tree = directory / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/nodeagent-image-test").write_text(f"version {version}\n")
    layer = tool.make_layer(tree, 1_700_000_000)
    config = tool.canonical_json(tool.image_config([layer], 1_700_000_000, version))
    layout = directory / "layout"
    digest: str = tool.write_layout(layout, [layer], config, version)
    return layout, digest


def derived_layout(layout: Path, directory: Path, version: str) -> tuple[Path, str]:
    """The image of ``layout`` (tools/build_image.py's) with one more small layer marking
    ``version``: a next nodeagent image that runs as the first does, with another digest,
    for the price of one tiny layer. Returns (its layout, its manifest digest)."""
    tool = build_image_tool()
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]))
    config = json.loads(_blob(layout, manifest["config"]["digest"]))
    layers = [
        tool.Layer(_blob(layout, part["digest"]), diff_id)
        for part, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True)
    ]
    tree = directory / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/nodeagent-image-test").write_text(f"version {version}\n")
    marker = tool.make_layer(tree, 1_700_000_000)
    layers.append(marker)
    config["rootfs"]["diff_ids"].append(marker.diff_id)
    config["history"].append({"created": config["created"], "created_by": f"test: {version}"})
    config["config"]["Labels"]["org.opencontainers.image.version"] = version
    out = directory / "layout"
    digest: str = tool.write_layout(out, layers, tool.canonical_json(config), version)
    return out, digest


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def signed_statement(
    target: Path, key: Path, digest: str, sequence: int, version: str = "9.9.9"
) -> bytes:
    """A bundle's statement (no archive lines) signed with ``key``: the statement's bytes;
    the signature is ``<target>.sig``."""
    tool = build_image_tool()
    text: bytes = tool.statement(None, digest, sequence, version)
    tool.sign_statement(target, text, key)
    return text


def staged_update(
    directory: Path, key: Path, *, version: str = "9.9.9", sequence: int = 2000
) -> tuple[Path, str]:
    """What the daemon stages for the host's loader (decision 0074): ``statement``,
    ``statement.sig`` and ``layout/``; returns (the staged directory, the digest)."""
    made, digest = tiny_layout(directory / "made", version)
    staged = directory / "staged"
    staged.mkdir(parents=True)
    made.rename(staged / "layout")
    signed_statement(staged / "statement", key, digest, sequence, version)
    return staged, digest


def push_layout(registry_host: str, layout: Path, version: str) -> tuple[str, str]:
    """The layout's image into the test registry under the same manifest digest; returns
    (``host/nodeagent@digest``, digest)."""
    target = f"{registry_host}/nodeagent:{version}"
    cmd = ["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"]
    subprocess.run([*cmd, f"oci:{layout}", f"docker://{target}"], check=True)
    inspect = ["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}"]
    found = subprocess.run(
        [*inspect, f"docker://{target}"], check=True, capture_output=True, text=True
    )
    digest = found.stdout.strip()
    return f"{registry_host}/nodeagent@{digest}", digest


def agent_bundle(
    work: Path, registry_host: str, ref: str, statement: Path, *, bundle_id: str, secret: str
) -> Path:
    """``bundle create --image REF --agent-image-statement STATEMENT`` (a real subprocess),
    signed with the minisign ``secret``; the bundle's directory."""
    key = work / f"{bundle_id}.key"
    key.write_text(secret)
    out = work / bundle_id
    cmd = [
        sys.executable, "-m", "nodeagent", "--config", str(work / "none.toml"),
        "bundle", "create", "--image", ref, "--key", str(key), "--output", str(out),
        "--insecure-registry", registry_host, "--id", bundle_id,
        "--agent-image-statement", str(statement),
    ]  # fmt: skip
    made = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    return out


@dataclass(frozen=True)
class LoaderPaths:
    state: Path
    keys: Path
    runroot: Path
    mnt: Path

    @classmethod
    def under(cls, base: Path, *, runroot: Path) -> LoaderPaths:
        paths = cls(base / "state", base / "keys", runroot, base / "mnt")
        for path in (paths.state, paths.keys, paths.runroot, paths.mnt):
            path.mkdir(parents=True, exist_ok=True)
        return paths

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            NODEAGENT_IMAGE_STATE=str(self.state),
            NODEAGENT_IMAGE_KEYS=str(self.keys),
            NODEAGENT_IMAGE_RUNROOT=str(self.runroot),
            NODEAGENT_IMAGE_MNT=str(self.mnt),
            NODEAGENT_IMAGE_DRIVER="vfs",
        )

    def podman(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["podman", "--root", str(self.state / "storage"), "--runroot", str(self.runroot)]
        cmd += ["--storage-driver", "vfs", *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)


def run_loader(
    paths: LoaderPaths, *devices: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOADER), *devices],
        env=paths.env() | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


NOTIFY_C = r"""
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
/* Sends each argument as one sd_notify datagram to $NOTIFY_SOCKET, 0.2 s apart. */
int main(int argc, char **argv) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path) return 3;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
    for (int i = 1; i < argc; i++) {
        int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
        sendto(fd, argv[i], strlen(argv[i]), 0, (struct sockaddr *)&addr, sizeof(addr));
        close(fd);
        usleep(200000);
    }
    sleep(1);
    return 0;
}
"""


def notify_layout(directory: Path) -> Path:
    """An OCI layout of one static binary, ``/notify``, its entrypoint: it sends its
    arguments to ``$NOTIFY_SOCKET`` as the daemon's notifier would."""
    tool = build_image_tool()
    tree = directory / "tree"
    tree.mkdir(parents=True)
    source = directory / "notify.c"
    source.write_text(NOTIFY_C)
    cmd = ["cc", "-static", "-Os", "-o", str(tree / "notify"), str(source)]
    subprocess.run(cmd, check=True, capture_output=True)
    layer = tool.make_layer(tree, 1_700_000_000)
    config = tool.image_config([layer], 1_700_000_000, "notify")
    config["config"] = {"Entrypoint": ["/notify"]}
    layout = directory / "layout"
    tool.write_layout(layout, [layer], tool.canonical_json(config), "notify")
    return layout
