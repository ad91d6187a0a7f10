"""``nodeagent bundle keygen``: a minisign key pair for signing bundles (issue 28).

Writes ``<name>.pub`` (0644) and ``<name>.key`` (0600) in ``--output-dir``, as ``minisign
-G`` does: the secret key encrypted with the password of ``--password-file`` (scrypt with
minisign's own limits), or, with ``--unencrypted``, as ``minisign -G -W`` writes it. Never
over an existing file. Prints the key id and where each file goes: the public key into
``/etc/nodeagent/trusted-keys.d/`` on every node, the secret key kept off the nodes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from nodeagent.adapters.files import write_new
from nodeagent.bundles import minisign
from nodeagent.cli import output
from nodeagent.cli.bundle_create import Subparsers
from nodeagent.config import Config
from nodeagent.errors import KeyMalformed
from nodeagent.strict import clip

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def add_parser(commands: Subparsers) -> None:
    keygen = commands.add_parser(
        "keygen", help="make a minisign key pair to sign bundles (the .pub goes to the nodes)"
    )
    keygen.add_argument("--name", required=True, help="file name of both keys, e.g. factory")
    keygen.add_argument(
        "--output-dir", type=Path, default=Path(), help="where to write them (default: .)"
    )
    keygen.add_argument("--comment", default="", help="the keys' untrusted comment")
    secret = keygen.add_mutually_exclusive_group()
    secret.add_argument(
        "--password-file", type=Path, help="encrypt the secret key with this file's first line"
    )
    secret.add_argument(
        "--unencrypted", action="store_true",
        help="write the secret key unencrypted (as minisign -G -W), for an HSM-less CI signer",
    )  # fmt: skip


def cmd_keygen(_config: Config, args: argparse.Namespace) -> int:
    if not _NAME.fullmatch(args.name):
        raise KeyMalformed(
            f"key name {clip(args.name, 64)!r}: use letters, digits, '.', '_' and '-' "
            "(at most 64), starting with a letter or a digit"
        )
    if args.password_file is None and not args.unencrypted:
        raise KeyMalformed(
            "say how to keep the secret key: --password-file FILE (encrypted with the file's "
            "first line) or --unencrypted"
        )
    password = None if args.unencrypted else _first_line(args.password_file)
    comment = args.comment or f"nodeagent bundle signing key {args.name}"
    public, secret = minisign.generate_keypair(comment=comment, password=password)
    key_id = minisign.parse_public_key(public).key_id_hex
    directory = args.output_dir
    write_new(directory / f"{args.name}.key", secret.encode(), mode=0o600)
    write_new(directory / f"{args.name}.pub", public.encode(), mode=0o644)
    lines = {
        "keyId": key_id,
        "publicKey": str(directory / f"{args.name}.pub"),
        "secretKey": str(directory / f"{args.name}.key"),
        "encrypted": password is not None,
    }
    if args.json:
        output.print_json("bundle-keygen", lines)
        return 0
    print(f"key {key_id}: {lines['publicKey']} and {lines['secretKey']}")
    print(
        f"next: copy {args.name}.pub to /etc/nodeagent/trusted-keys.d/ on every node "
        "(a MachineConfig or the package); keep "
        f"{args.name}.key off the nodes and sign with `nodeagent bundle create --key "
        f"{lines['secretKey']}`",
        file=sys.stdout,
    )
    return 0


def _first_line(path: Path) -> bytes:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KeyMalformed(f"cannot read the password file {path}: {err}") from err
    first = text.splitlines()[0] if text.splitlines() else ""
    if not first:
        raise KeyMalformed(
            f"the password file {path} is empty: put the password on its first line, or pass "
            "--unencrypted"
        )
    return first.encode()
