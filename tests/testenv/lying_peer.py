"""A scripted peer with a valid node certificate that lies or drips (tests/security).

``python -m tests.testenv.lying_peer BUNDLE_DIR[,DIR...] PEM CA ADDR PORT --mode MODE`` (in a
node's namespace through ``SiteHost.exec_prefix``, or on 127.0.0.1) serves the peer
protocol of docs/site.md over mutual TLS (its certificate from the site's CA, a client
certificate of the site required), for the signed bundles in the ``BUNDLE_DIR``s (what
``signed_bundles.signed_bundle`` writes: ``bundle.json``, its signature, ``blobs/sha256``):

* ``fake-digest``: publishes the bundle id under a manifest digest of its own, made to sort
  after the honest one (the old rule took the largest digest on a 1:1 tie): its
  ``bundle.json`` is the honest one with trailing white space, with the honest signature,
  which does not verify over it. Blobs: 404.
* ``drip``: publishes the honest bundle, complete, ``uploads.active = 0`` (idle, so the
  fetcher's old rule preferred it), answers holdings, ``have`` and the signed manifest at
  once, and sends each blob one byte every ``--drip-s`` seconds after a correct head.
* ``drip-all``: as ``drip``, and its holdings too come one byte every ``--drip-s``.
* ``bad-blob``: publishes the honest bundle, complete and idle (so it is preferred), and
  sends each blob with its honest length and one byte changed (a peer that sends one bad
  blob, which failed a whole pull when peers were listed in registries.conf: decision 0061).
* ``big-ecdsa-sig``: publishes the honest bundle, complete and idle, and answers its
  ``bundle.json.ecdsa-sig`` with 64 KiB (the format's bound is 1 KiB: decision 0075).
* ``many-fakes``: publishes ``--count`` bundle ids, each under a digest that changes with
  every holdings request (a peer inventing digests to grow a fetcher's memory).

``--armed-by FILE``: its holdings list nothing until FILE exists (a timed test starts the
attack when the honest source gets the bundle).

It prints ``ready`` once listening, then one line per request: ``GET <path> from <ip>``.
It writes no file and ends when killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import os
import ssl
import subprocess
import sys
from pathlib import Path

from nodeagent.bundles.manifest import parse_manifest
from nodeagent.site.holdings import BundleHolding, Holdings, have_of, render_have, render_holdings
from tests.testenv.waiting import wait_for

MODES = ("fake-digest", "drip", "drip-all", "bad-blob", "many-fakes", "big-ecdsa-sig")


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def fake_manifest(honest: bytes) -> bytes:
    """The honest manifest with trailing white space, its digest above the honest one."""
    target = digest_of(honest)
    for count in itertools.count(1):
        data = honest + b"\n" * count
        if digest_of(data) > target:
            return data
    raise AssertionError("unreachable")


class Offered:
    """One bundle the peer serves (the honest files, or a fake manifest for the first)."""

    def __init__(self, bundle_dir: Path, *, is_fake: bool) -> None:
        self.honest = (bundle_dir / "bundle.json").read_bytes()
        self.signature = (bundle_dir / "bundle.json.minisig").read_bytes()
        self.manifest = parse_manifest(self.honest)
        self.served = fake_manifest(self.honest) if is_fake else self.honest
        self.blobs = {d: bundle_dir / "blobs" / "sha256" / d[7:] for d in self.manifest.blobs}

    def holding(self) -> BundleHolding:
        sizes = [b.size_bytes for b in self.manifest.blobs.values()]
        digest, count, total = digest_of(self.served), len(sizes), sum(sizes)
        return BundleHolding(self.manifest.bundle_id, digest, count, count, total, total)


class Peer:
    def __init__(
        self, bundle_dirs: list[Path], mode: str, drip_s: float, count: int, armed_by: str
    ) -> None:
        self.mode, self.drip_s, self.count = mode, drip_s, count
        self.armed_by = Path(armed_by) if armed_by else None
        offered = [Offered(d, is_fake=mode == "fake-digest") for d in bundle_dirs]
        self.bundles = {o.manifest.bundle_id: o for o in offered}
        self.first = offered[0]
        self.asked = itertools.count()

    def holdings(self) -> bytes:
        if self.mode == "many-fakes":
            turn = next(self.asked)
            bundles = tuple(
                BundleHolding(f"fake-{i:04d}", digest_of(b"%d-%d" % (turn, i)), 1, 1, 1, 1)
                for i in range(self.count)
            )
        elif self.armed_by is not None and not self.armed_by.exists():
            bundles = ()  # not offering yet
        else:
            bundles = tuple(o.holding() for o in self.bundles.values())
        return render_holdings(Holdings("scripted-peer", 0, 3, bundles))

    def answer(self, path: str) -> tuple[int, bytes, bool]:
        """(status, body, whether to drip it)."""
        if path == "/nodeagent/v1/holdings":
            return 200, self.holdings(), self.mode == "drip-all"
        parts = path.split("/")  # /nodeagent/v1/bundles/<id>/<file>
        if len(parts) == 6 and parts[1:4] == ["nodeagent", "v1", "bundles"]:
            # many-fakes: the first bundle's signed pair under any id it invented
            offered = self.bundles.get(parts[4]) or (
                self.first if self.mode == "many-fakes" else None
            )
            answered = self.bundle_file(offered, parts[5]) if offered is not None else None
            if answered is not None:
                return answered
        digest = path.rpartition("/blobs/")[2]
        found = next((o.blobs[digest] for o in self.bundles.values() if digest in o.blobs), None)
        if self.mode.startswith("drip") and found is not None:
            return 200, found.read_bytes(), True
        if self.mode == "bad-blob" and found is not None:
            data = bytearray(found.read_bytes())
            data[len(data) // 2] ^= 0xFF
            return 200, bytes(data), False
        return 404, b'{"errors":[{"code":"NOT_FOUND"}]}', False

    def bundle_file(self, offered: Offered, name: str) -> tuple[int, bytes, bool] | None:
        """A bundle's ``have`` or one of its files; None for anything else."""
        if name == "have":
            have = have_of(digest_of(offered.served), offered.blobs, set(offered.blobs))
            return 200, render_have(have), False
        if name == "bundle.json.ecdsa-sig":
            if self.mode == "big-ecdsa-sig":
                return 200, b"A" * (64 << 10), False
            return 404, b'{"errors":[{"code":"NOT_FOUND"}]}', False
        if name in ("bundle.json", "bundle.json.minisig"):
            body = offered.served if name == "bundle.json" else offered.signature
            return 200, body, False
        return None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
                print(f"GET {path} from {writer.get_extra_info('peername')[0]}", flush=True)
                status, body, drip = self.answer(path)
                reason = "OK" if status == 200 else "Not Found"
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
                    f"Content-Type: application/octet-stream\r\n\r\n".encode()
                )
                if not drip:
                    writer.write(body)
                    await writer.drain()
                    continue
                for index in range(len(body)):
                    writer.write(body[index : index + 1])
                    await writer.drain()
                    await asyncio.sleep(self.drip_s)
        writer.close()


async def serve(args: argparse.Namespace) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.ca)
    context.load_cert_chain(args.pem)
    context.verify_mode = ssl.CERT_REQUIRED
    dirs = [Path(d) for d in args.bundle_dir.split(",")]
    peer = Peer(dirs, args.mode, args.drip_s, args.count, args.armed_by)
    server = await asyncio.start_server(peer.handle, args.addr, args.port, ssl=context)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready on port {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv.lying_peer")
    for name in ("bundle_dir", "pem", "ca", "addr"):
        parser.add_argument(name)
    parser.add_argument("port", type=int)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--drip-s", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--armed-by", default="", help="offer nothing until this file exists")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


class ScriptedPeer:
    """``lying_peer`` as a process: in a node's namespace (``prefix`` its exec prefix) or on
    loopback; ``requests()`` what it was asked, ``close()`` kills it (by its pid)."""

    def __init__(
        self,
        workdir: Path,
        bundle_dirs: list[Path],
        pem: Path,
        ca: Path,
        *,
        addr: str,
        port: int,
        mode: str,
        prefix: list[str] | None = None,
        drip_s: float = 2.0,
        count: int = 4096,
        armed_by: Path | None = None,
    ) -> None:
        self.addr = addr
        self.address = f"{addr}:{port}"  # port 0: the kernel's choice, known once ready
        self.log_path = workdir / f"scripted-peer-{mode}-{port or 'any'}.log"
        workdir.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[2]
        command = [
            *(prefix or []), sys.executable, "-m", "tests.testenv.lying_peer",
            ",".join(map(str, bundle_dirs)), str(pem), str(ca), addr, str(port), "--mode", mode,
            "--drip-s", str(drip_s), "--count", str(count), "--armed-by", str(armed_by or ""),
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=repo)
        wait_for(self._ready, timeout_s=30, what=f"the scripted {mode} peer to listen")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the scripted peer exited: {self.log_path.read_text()}")
        for line in self.log_path.read_text().splitlines():
            if line.startswith("ready on port "):
                self.address = f"{self.addr}:{int(line.split()[-1])}"
                return True
        return False

    def requests(self, needle: str = "") -> list[str]:
        lines = self.log_path.read_text().splitlines()
        return [line for line in lines if line.startswith("GET ") and needle in line]

    def manifests_asked(self, by: str = "") -> list[str]:
        """The ``bundle.json`` requests (not their signatures), from ``by`` if given."""
        return [
            r.split()[1]
            for r in self.requests(f" from {by}")
            if r.split()[1].endswith("/bundle.json")
        ]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
