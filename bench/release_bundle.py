"""Release bundle benchmark: ``bundle create --release`` of a synthetic OpenShift release.

A registry of its own (Debian's docker-registry, loopback) gets ``--payload`` payload images
(each a multi-arch index of two one-layer images of ``--layer-kib`` KiB) and a multi-arch
release naming them (tests/testenv/release.py); one gpg signature goes in a signature store.
Then ``nodeagent bundle create --release`` runs in process, timed, and the bundle's size is
measured on disk. Run::

    .venv/bin/python -m bench.release_bundle [--payload 180] [--layer-kib 2] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from nodeagent.bundles import minisign
from nodeagent.cli import main as cli
from tests.testenv.registry import Registry
from tests.testenv.release import TestGpg, push_release, signature_document, write_signature_store


def directory_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run(payload: int, layer_kib: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="release-bench-") as name:
        work = Path(name)
        gpg = TestGpg.make(work / "gnupg")
        with Registry(work / "registry") as registry:
            started = time.monotonic()
            release = push_release(
                registry.url, registry.host, work, version="4.99.0",
                payload_count=payload, layer_bytes=layer_kib * 1024,
            )  # fmt: skip
            push_s = time.monotonic() - started
            store = write_signature_store(
                work / "sigs", release.digest, [gpg.sign(signature_document(release))]
            )
            _, secret = minisign.generate_keypair(comment="bench")
            (work / "k.key").write_text(secret)
            output = work / "bundle"
            out, err = io.StringIO(), io.StringIO()
            started = time.monotonic()
            with redirect_stdout(out), redirect_stderr(err):
                code = cli.main([
                    "--config", "/nonexistent/config.toml", "bundle", "create",
                    "--release", release.ref, "--signature-dir", str(store),
                    "--key", str(work / "k.key"), "--output", str(output), "--arch", "amd64",
                    "--insecure-registry", registry.host,
                ])  # fmt: skip
            create_s = time.monotonic() - started
        gpg.close()
        if code != 0:
            raise SystemExit(f"bundle create failed ({code}): {err.getvalue()}")
        doc = json.loads((output / "bundle.json").read_text())
        return {
            "payload_images": payload,
            "images_in_bundle": len(doc["images"]),
            "blobs": len(doc["blobs"]),
            "bundle_bytes": directory_bytes(output),
            "bundle_json_bytes": (output / "bundle.json").stat().st_size,
            "push_s": round(push_s, 1),
            "create_s": round(create_s, 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", type=int, default=180)
    parser.add_argument("--layer-kib", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.payload, args.layer_kib)
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
