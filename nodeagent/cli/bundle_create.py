"""``nodeagent bundle create`` (``nodeagent.cli.bundle`` registers it): its options, read and
checked, and the command.

It fetches images by digest from their registries into an OCI layout and signs its
``bundle.json`` with a minisign secret key, printing progress on a terminal (stderr) and
nothing else there otherwise. The format is docs/bundle-format.md. Registries are read as the
daemon reads them (``adapters.registry.access``): registries.conf's mirrors first, each host's
credentials from ``--auth-file`` then CRI-O's ``global_auth_file``, certs.d CAs and client
certificates, all from the ``[runtime]`` settings of nodeagent's configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from nodeagent.authfile import AuthStore, parse_auth_file
from nodeagent.bundles.agent_image import MAX_STATEMENT_BYTES
from nodeagent.bundles.freshness import (
    DEFAULT_CHANNEL,
    MAX_SEQUENCE,
    Freshness,
    expiry_from_option,
    freshness_of,
    is_expired,
    is_key_id,
    supersedes_of,
)
from nodeagent.bundles.manifest import ECDSA_SIGNATURE_NAME
from nodeagent.bundles.tags import served_tags_of_images
from nodeagent.bundles.target import BundleTarget, describe_target, parse_selector_text
from nodeagent.cli import output
from nodeagent.cli import release as release_cli
from nodeagent.cli.terminal import TerminalProgress, out
from nodeagent.config import Config
from nodeagent.errors import (
    AuthFileInvalid,
    BundleManifestInvalid,
    HostFileError,
    ImageStatementInvalid,
    KeyMalformed,
    SecretKeyLocked,
    SpecInvalid,
)
from nodeagent.registries import LINUX_ARCHITECTURES, Platform, node_platform
from nodeagent.specs import PinnedImageSet, parse_spec_text
from nodeagent.strict import clip
from nodeagent.units import format_bytes

if TYPE_CHECKING:
    # Imported by the command that uses it: `nodeagent run` parses these arguments too.
    from nodeagent.adapters.bundles import writer as bundle_writer
    from nodeagent.bundles import minisign

_ARCH = re.compile(r"(?:linux/)?([a-z0-9_]+)(?:/(v[0-9]+))?")

BUNDLE_TIMEOUT_S = 30.0
"""Connect and per-read timeout of ``bundle create``'s registry requests (the client's default)."""

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(commands: Subparsers) -> None:
    """Register ``bundle create`` on ``bundle``'s subparsers."""
    create = commands.add_parser("create", help="fetch images by digest into a signed bundle")
    create.add_argument(
        "--image", action="extend", nargs="+", default=[], metavar="REF",
        help="image by digest (host/repo@sha256:...); the sets' images are added too; with "
        "--serve-tags, host/repo:tag@sha256:... also serves that tag",
    )  # fmt: skip
    create.add_argument(
        "--pinned-image-set", action="extend", nargs="+", default=[], type=Path, metavar="FILE",
        help="PinnedImageSet YAML file to carry (validated as the daemon validates it)",
    )  # fmt: skip
    create.add_argument(
        "--key", type=Path,
        help="minisign secret key file (--key, --ecdsa-key or both; none with --dry-run)",
    )  # fmt: skip
    create.add_argument(
        "--ecdsa-key", type=Path, metavar="FILE.pem",
        help="also (or instead) sign with this ECDSA P-256/P-384 private key (PEM, "
        "unencrypted), as nodes in FIPS mode need (bundle.json.ecdsa-sig)",
    )  # fmt: skip
    create.add_argument(
        "--dry-run", action="store_true",
        help="write nothing: print the images, the blob count, the bytes and what the output's "
        "disk needs against its free space (exit 73 when it does not fit)",
    )  # fmt: skip
    create.add_argument("--password-file", type=Path, help="the key's password (first line)")
    create.add_argument("--output", type=Path, required=True, help="empty directory or medium")
    create.add_argument("--id", dest="bundle_id", help="bundle id (default: from the content)")
    create.add_argument(
        "--arch", "--target-arch", dest="arch", type=parse_platform,
        default=node_platform(os.uname().machine),
        help="the architecture the bundle is for, its images resolved for it: amd64, arm64, "
        "arm/v7... (default: this machine's); nodes of another one never take the bundle",
    )  # fmt: skip
    create.add_argument(
        "--target-selector", type=parse_target_selector, default=None, metavar="SELECTOR",
        help="only nodes whose labels match this selector (kubectl -l form, e.g. "
        "'node-role.kubernetes.io/worker,site=line-3') take the bundle",
    )  # fmt: skip
    create.add_argument(
        "--channel", type=parse_channel, default=DEFAULT_CHANNEL,
        help="the release line of the signing key the bundle belongs to (default: default); "
        "a node never takes an older bundle of a key and channel after a newer one",
    )  # fmt: skip
    create.add_argument(
        "--sequence", type=parse_sequence, default=None, metavar="N",
        help=f"the bundle's place in its channel, 0 to {MAX_SEQUENCE}, higher than every "
        "earlier bundle's (default: the creation time in seconds since 1970)",
    )  # fmt: skip
    create.add_argument(
        "--expires", type=parse_expires, default=None, metavar="TIME",
        help="no node takes the bundle after this RFC 3339 UTC time (2027-01-31T00:00:00Z), "
        "or this long after its creation (30d, 12h, 90m); default: never",
    )  # fmt: skip
    create.add_argument(
        "--supersedes", action="append", default=[], type=parse_key_id, metavar="KEYID",
        help="the signing key replaces the key of this id (as `bundle verify` shows it): "
        "nodes then judge both keys' bundles against one anti-rollback mark, so the old key "
        "cannot take them back (repeat for up to 8 keys)",
    )  # fmt: skip
    create.add_argument("--auth-file", type=Path, help="docker config JSON with credentials")
    create.add_argument(
        "--insecure-registry", action="extend", nargs="+", default=[], metavar="HOST",
        help="reach this registry over plain HTTP",
    )  # fmt: skip
    create.add_argument(
        "--transient", action="store_true", help="the sets last until reboot (/run), not /etc"
    )
    release_cli.add_create_arguments(create)
    create.add_argument(
        "--with-signatures", action="store_true",
        help="carry each image's sigstore signature (tag sha256-<hex>.sig) when its registry "
        "has one, for nodes whose signature policy requires them",
    )  # fmt: skip
    create.add_argument(
        "--agent-image-statement", type=Path, metavar="FILE",
        help="carry nodeagent's own image (one of the --image values) for the container "
        "variant's self-update: FILE is its statement signed by an agent image key "
        "(tools/build_image.py --sign-key), FILE.sig beside it (docs/install-rhcos.md)",
    )  # fmt: skip
    create.add_argument(
        "--serve-tags", action="store_true",
        help="sign the tag of each --image given as host/repo:tag@sha256:...: nodes answer "
        "pulls of that tag with exactly that digest, frozen even once the registry moves it "
        "(imagePullPolicy: Always by tag, e.g. OLM catalogs; docs/mirror.md)",
    )  # fmt: skip


# ---------------------------------------------------------------- input
def parse_platform(text: str) -> Platform:
    """``amd64``, ``arm64``, ``arm/v7`` (optionally ``linux/``-prefixed) as a Linux platform;
    the architecture must be one of Go's (``registries.LINUX_ARCHITECTURES``)."""
    match = _ARCH.fullmatch(text.strip())
    if match is None or match[1] not in LINUX_ARCHITECTURES:
        known = ", ".join(sorted(LINUX_ARCHITECTURES))
        raise argparse.ArgumentTypeError(
            f"{clip(text, 80)!r} is not an architecture like amd64 or arm/v7 (one of {known})"
        )
    return Platform("linux", match[1], match[2] or "")


def parse_channel(text: str) -> str:
    """``--channel``: the form ``bundle.json``'s channel is read with."""
    try:
        return freshness_of({"channel": text}, "1970-01-01T00:00:00Z").channel
    except BundleManifestInvalid as exc:
        raise argparse.ArgumentTypeError(exc.message.removeprefix("bundle.json: ")) from None


def parse_sequence(text: str) -> int:
    """``--sequence``: a decimal integer from 0 to 2^53-1."""
    if not text.isdecimal() or len(text) > 16 or not 0 <= int(text) <= MAX_SEQUENCE:
        raise argparse.ArgumentTypeError(
            f"{clip(text, 40)!r} is not an integer 0 to {MAX_SEQUENCE}"
        )
    return int(text)


def parse_key_id(text: str) -> str:
    """``--supersedes``: a key id as minisign and ``bundle verify`` show it."""
    if not is_key_id(text):
        raise argparse.ArgumentTypeError(
            f"{clip(text, 40)!r} is not a key id (upper-case hex without leading zeros)"
        )
    return text


def parse_expires(text: str) -> str:
    """``--expires``, checked now (its time is computed from the creation time later)."""
    try:
        expiry_from_option(text, datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_target_selector(text: str) -> BundleTarget:
    """``--target-selector``: the rules ``bundle.json``'s target is read with."""
    try:
        return BundleTarget(parse_selector_text(text, "--target-selector"))
    except BundleManifestInvalid as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def load_set_files(paths: Sequence[Path], *, is_persistent: bool) -> list[PinnedImageSet]:
    """Every PinnedImageSet in ``paths``, validated as the daemon validates them; all or none."""
    sets: dict[str, PinnedImageSet] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SpecInvalid(f"cannot read PinnedImageSet file {path}: {why(err)}") from err
        load = parse_spec_text(text, source=str(path), is_persistent=is_persistent)
        if load.problems:
            first = load.problems[0]
            raise SpecInvalid(first.text())
        if not load.sets:
            raise SpecInvalid(f"{path} holds no PinnedImageSet")
        for image_set in load.sets:
            if sets.setdefault(image_set.name, image_set) is not image_set:
                raise SpecInvalid(f"PinnedImageSet {image_set.name} is defined twice ({path})")
    return list(sets.values())


def read_secret_key(path: Path, password_file: Path | None) -> minisign.SecretKey:
    """The signing key; its password from ``password_file``, else asked on the terminal."""
    from nodeagent.bundles import minisign  # noqa: PLC0415  (see the imports)

    text = _read_text(path, "secret key")
    password = None
    if password_file is not None:
        lines = _read_text(password_file, "password file").splitlines()
        password = lines[0] if lines else ""
    try:
        return minisign.parse_secret_key(text, password=password)
    except SecretKeyLocked:
        if password is not None or not sys.stdin.isatty():
            raise
    except KeyMalformed as exc:
        raise KeyMalformed(f"{path}: {exc.message}") from None
    import getpass  # noqa: PLC0415  only for a locked key on a terminal

    return minisign.parse_secret_key(text, password=getpass.getpass(f"password for {path}: "))


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KeyMalformed(f"cannot read the {what} {path}: {why(err)}") from err


def signing_keys(args: argparse.Namespace) -> tuple[minisign.SecretKey | None, bytes | None]:
    """``--key`` (read and unlocked) and ``--ecdsa-key`` (its bytes): one of them at least,
    but with ``--dry-run`` (which reads neither)."""
    if args.dry_run:
        return None, None
    if args.key is None and args.ecdsa_key is None:
        raise KeyMalformed(
            "bundle create needs --key (the minisign secret key file to sign with), "
            "--ecdsa-key (an ECDSA P-256/P-384 private key, PEM) or both"
        )
    secret_key = read_secret_key(args.key, args.password_file) if args.key else None
    return secret_key, read_ecdsa_key(args.ecdsa_key)


def read_ecdsa_key(path: Path | None) -> bytes | None:
    """``--ecdsa-key FILE.pem``: the private key's bytes (bounded; checked where it is used)."""
    from nodeagent.bundles.ecdsa_signature import MAX_KEY_BYTES  # noqa: PLC0415

    if path is None:
        return None
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_KEY_BYTES + 1)
    except OSError as err:
        raise HostFileError(f"cannot read {path}: {why(err)}") from err
    if len(data) > MAX_KEY_BYTES:
        raise KeyMalformed(f"{path} is larger than {MAX_KEY_BYTES} bytes for an ECDSA key")
    return data


def read_agent_statement(path: Path | None) -> tuple[bytes, bytes] | None:
    """``--agent-image-statement FILE``: FILE and FILE.sig, each bounded, or None."""
    if path is None:
        return None
    found = []
    for source in (path, path.with_name(path.name + ".sig")):
        try:
            with source.open("rb") as stream:
                found.append(stream.read(MAX_STATEMENT_BYTES + 1))
        except OSError as err:
            raise HostFileError(f"cannot read {source}: {why(err)}") from err
    statement, signature = found
    if len(statement) > MAX_STATEMENT_BYTES:
        raise ImageStatementInvalid(f"{path} is larger than {MAX_STATEMENT_BYTES} bytes")
    return statement, signature


def read_auth(path: Path | None) -> AuthStore:
    """Credentials from ``path`` (or $REGISTRY_AUTH_FILE); none: anonymous pulls."""
    from_env = os.environ.get("REGISTRY_AUTH_FILE")
    chosen = path or (Path(from_env) if from_env else None)
    if chosen is None:
        return AuthStore.empty("(no auth file)")
    try:
        return parse_auth_file(chosen.read_text(encoding="utf-8"), source=str(chosen))
    except (OSError, UnicodeDecodeError) as err:
        raise AuthFileInvalid(f"cannot read the auth file {chosen}: {why(err)}") from err


def why(err: OSError | UnicodeDecodeError) -> str:
    """An error reading a file, without the file name an OSError repeats."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err)


# ---------------------------------------------------------------- create
def cmd_create(config: Config, args: argparse.Namespace) -> int:
    from nodeagent.adapters.bundles import writer as bundle_writer  # noqa: PLC0415  (see the imports)
    from nodeagent.adapters.registry.access import registry_access  # noqa: PLC0415

    secret_key, ecdsa_key = signing_keys(args)
    auth = read_auth(args.auth_file)
    sets = load_set_files(args.pinned_image_set, is_persistent=not args.transient)
    release = release_cli.release_request(args)
    release_image = [str(release.ref)] if release is not None else []
    refs = bundle_writer.resolve_refs(
        [*release_image, *args.image], sets, is_serving_tags=args.serve_tags
    )
    served_tags = served_tags_of_images(args.image) if args.serve_tags else []
    now = datetime.now(UTC)
    freshness = freshness_option(args, now)
    # As the daemon's look-ups: registries.conf's mirrors, certs.d, CRI-O's auth file after ours.
    client = registry_access(
        config.runtime, auth.credentials_for, extra_insecure=args.insecure_registry,
        platform=args.arch, timeout_s=BUNDLE_TIMEOUT_S,
    ).client  # fmt: skip
    if args.dry_run:
        from nodeagent.cli import bundle_plan  # noqa: PLC0415  (only for --dry-run)

        return bundle_plan.cmd_dry_run(
            args, refs, sets, client=client, auth=auth, now=now, freshness=freshness,
            release=release, served_tags=served_tags,
        )  # fmt: skip
    check_supersedes(freshness, bundle_writer.signing_key_id(secret_key, ecdsa_key))
    progress = TerminalProgress() if sys.stderr.isatty() else None
    try:
        created = asyncio.run(
            bundle_writer.create_bundle(
                refs, sets, secret_key, args.output, client=client, auth=auth,
                bundle_id=args.bundle_id, target=args.target_selector,
                progress=progress.blobs if progress else None, release=release,
                now=now, freshness=freshness, with_signatures=args.with_signatures,
                served_tags=served_tags,
                agent_statement=read_agent_statement(args.agent_image_statement),
                ecdsa_key=ecdsa_key,
            )
        )  # fmt: skip
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        print_json_created(created, args, freshness)
        return 0
    out(
        f"created bundle {created.bundle_id} in {created.path}: {len(created.images)} images, "
        f"{created.blob_count} blobs, {format_bytes(created.size_bytes)}, "
        f"signed by key {created.key_id_hex}"
    )
    if args.ecdsa_key is not None:
        both = "beside the minisign one" if args.key is not None else "only (no minisign)"
        out(f"  ECDSA signature ({ECDSA_SIGNATURE_NAME}) {both}")
    out(f"  for {describe_target(args.arch.architecture, created.target)}")
    if created.release is not None:
        out(
            f"  release {created.release.version}: {created.payload_count} payload images, "
            f"set {created.release.set_name}, {len(created.release.signatures)} signatures"
        )
    expiry = f", expires {freshness.expires}" if freshness.expires else ""
    out(f"  channel {freshness.channel}, sequence {freshness.sequence}{expiry}")
    if freshness.supersedes:
        out(f"  supersedes key {', '.join(freshness.supersedes)}")
    signed = {str(c.signature.image) for c in created.signatures}
    for image in created.images:
        mark = ", sigstore signature carried" if str(image.ref) in signed else ""
        out(f"  {image.ref} ({format_bytes(image.size_bytes)}{mark})")
    if args.with_signatures:
        out(f"  {len(signed)} of {len(created.images)} images signed (sigstore)")
    for tag in created.served_tags:
        out(f"  serves tag {tag.reference} -> {tag.image.digest} (frozen on the nodes)")
    return 0


def print_json_created(
    created: bundle_writer.CreatedBundle, args: argparse.Namespace, freshness: Freshness
) -> None:
    """``bundle create --json``: what was written (docs/cli.md, nodeagent.bundle-create)."""
    signed = {str(c.signature.image) for c in created.signatures}
    release = created.release
    output.print_json("bundle-create", {
        "bundleId": created.bundle_id,
        "path": str(created.path),
        "keyId": created.key_id_hex,
        "architecture": args.arch.architecture,
        "blobs": created.blob_count,
        "sizeBytes": created.size_bytes,
        "channel": freshness.channel,
        "sequence": freshness.sequence,
        "expires": freshness.expires,
        "images": [
            {"image": str(i.ref), "sizeBytes": i.size_bytes, "signed": str(i.ref) in signed}
            for i in created.images
        ],
        "servedTags": {t.reference: t.image.digest for t in created.served_tags},
        "release": None if release is None else {
            "version": release.version, "setName": release.set_name,
            "payloadImages": created.payload_count, "signatures": len(release.signatures),
        },
    })  # fmt: skip


def freshness_option(args: argparse.Namespace, now: datetime) -> Freshness:
    """``--channel``, ``--sequence`` (default ``now`` in seconds) and ``--expires``."""
    sequence = int(now.timestamp()) if args.sequence is None else args.sequence
    expires = None if args.expires is None else expiry_from_option(args.expires, now)
    if expires is not None and is_expired(expires, now):
        raise BundleManifestInvalid(
            f"--expires {expires} is not after the creation time: no node would take the bundle"
        )
    supersedes = supersedes_of(args.supersedes) if args.supersedes else ()
    return Freshness(args.channel, sequence, expires, supersedes)


def check_supersedes(freshness: Freshness, key_id_hex: str) -> None:
    """A key cannot supersede itself."""
    if key_id_hex in freshness.supersedes:
        raise BundleManifestInvalid(
            f"--supersedes {key_id_hex} names the signing key itself; name the key it replaces"
        )
