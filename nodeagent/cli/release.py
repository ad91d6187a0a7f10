"""``bundle create --release`` and ``nodeagent bundle release-signatures`` (``cli.bundle``
registers both).

``--release PULLSPEC@sha256:…`` puts an OpenShift release and every payload image in the
bundle, with a PinnedImageSet ``release-<version>`` (``--release-set-name``); its
signatures come from ``--release-signature FILE`` (repeatable, numbered in order) or a
signature store (``--signature-dir DIR``: ``sha256=<hex>/signature-N``).

``release-signatures BUNDLE`` writes the ConfigMap the cluster-version operator reads
the release's signatures from (YAML, or JSON with ``--json``), ready for ``oc apply -f``.
BUNDLE is a bundle's directory (a mounted medium) or the id of a bundle in the node store;
its signature is checked against the trusted keys and every signature file against the
signed manifest before a byte is written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import (
    BundleIncomplete,
    ImageReferenceInvalid,
    ReleaseImageInvalid,
    ReleaseUnsigned,
)
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.strict import clip

if TYPE_CHECKING:
    from nodeagent.adapters.bundles.release import ReleaseRequest

_BUNDLE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def add_create_arguments(create: argparse.ArgumentParser) -> None:
    create.add_argument(
        "--release", type=parse_release_ref, metavar="PULLSPEC@sha256:…",
        help="an OpenShift release image by digest: it and every payload image go in the "
        "bundle, with a PinnedImageSet release-<version>",
    )  # fmt: skip
    create.add_argument(
        "--release-set-name", metavar="NAME", help="the release's set (default release-<version>)"
    )
    create.add_argument(
        "--from-version", metavar="VERSION", default="",
        help="the cluster's current version (oc get clusterversion): refuse to make the bundle "
        "unless the release upgrades from it (its release-metadata lists it in previous)",
    )  # fmt: skip
    signatures = create.add_mutually_exclusive_group()
    signatures.add_argument(
        "--release-signature", action="append", default=[], type=Path, metavar="FILE",
        help="a signature of the release digest to carry (repeatable: the first is -1)",
    )  # fmt: skip
    signatures.add_argument(
        "--signature-dir", type=Path, metavar="DIR",
        help="a release signature store: DIR/sha256=<hex>/signature-1, -2, …",
    )  # fmt: skip
    create.add_argument(
        "--require-signatures", action="store_true",
        help="refuse a release bundle that would carry no release signature (without it: a "
        "warning; the cluster-version operator then refuses the upgrade unless forced)",
    )  # fmt: skip


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "release-signatures", help="write the ConfigMap of a release bundle's signatures"
    )
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle directory or a stored id")
    parser.add_argument("--output", type=Path, help="write it here (default: standard output)")
    parser.add_argument(
        "--trusted-keys", type=Path, help="directory of trusted *.pub/*.pem keys (default: config)"
    )


def parse_release_ref(text: str) -> PinnedImageRef:
    try:
        return parse_pinned_image_ref(text.strip())
    except ImageReferenceInvalid as exc:
        raise argparse.ArgumentTypeError(
            f"--release {exc.message}; name the release by digest (oc adm release info "
            "--output=jsonpath='{.digest}' PULLSPEC)"
        ) from None


def release_request(args: argparse.Namespace) -> ReleaseRequest | None:
    """What ``--release`` and its signature options ask for; signatures read now."""
    from nodeagent.adapters.bundles import release as adapter  # noqa: PLC0415  (heavy)

    ref: PinnedImageRef | None = args.release
    if ref is None:
        if args.release_signature or args.signature_dir or args.release_set_name:
            raise ReleaseImageInvalid("release signatures and set name need --release")
        if args.from_version:
            raise ReleaseImageInvalid("--from-version needs --release")
        return None
    signatures: tuple[bytes, ...] = ()
    if args.release_signature:
        signatures = adapter.read_signature_files(args.release_signature, ref.digest)
    elif args.signature_dir is not None:
        signatures = adapter.read_signature_dir(args.signature_dir, ref.digest)
    if not signatures:
        unsigned = ReleaseUnsigned(
            f"the release {ref.digest} would be carried without any release signature: the "
            "cluster-version operator checks the release image's signature before it "
            "upgrades, and a site without the internet cannot fetch one"
        )
        if args.require_signatures:
            raise unsigned
        output.print_error(
            unsigned.reason, unsigned.message, prefix="warning",
        )  # fmt: skip
    return adapter.ReleaseRequest(ref, args.release_set_name, signatures, args.from_version)


def bundle_root(config: Config, text: str) -> Path:
    """BUNDLE: a directory, else a bundle id in the node store."""
    path = Path(text)
    if path.is_dir():
        return path.resolve()
    if _BUNDLE_ID.fullmatch(text):
        stored = config.store_dir / "bundles" / text
        if stored.is_dir():
            return stored
    raise BundleIncomplete(
        f"{clip(text, 200)} is neither a bundle directory nor a bundle id in the node store "
        f"({config.store_dir}); `nodeagent store` lists the stored ones"
    )


def config_map_of(config: Config, text: str, keys_dir: Path | None) -> dict[str, Any]:
    """The signature ConfigMap of the bundle BUNDLE names, every byte checked first."""
    from nodeagent.adapters.bundles import release as adapter  # noqa: PLC0415  (heavy)

    root = bundle_root(config, text)
    keys = keys_dir or config.bundles.trusted_keys_dir
    return adapter.config_map_at(root, keys, fips_switch=config.bundles.fips_switch)


def cmd_release_signatures(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.files import write_atomic  # noqa: PLC0415
    from nodeagent.bundles import release  # noqa: PLC0415

    config_map = config_map_of(config, args.bundle, args.trusted_keys)
    text = json.dumps(config_map, indent=2) + "\n" if args.json else release.render_yaml(config_map)
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_atomic(args.output, text.encode())
        count = len(config_map["binaryData"])
        sys.stderr.write(
            f"wrote ConfigMap {config_map['metadata']['name']} ({count} signatures) to "
            f"{args.output}; apply it with: oc apply -f {args.output}\n"
        )
    return 0
