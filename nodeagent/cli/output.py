"""What every command prints the same way: its ``--json`` document and its error lines.

``--json``: one JSON object on stdout whose first field ``schema`` names the document's
kind and version, ``nodeagent.<command>/v<N>`` (``SCHEMA_VERSIONS``); the schemas are
documented in docs/cli.md and kept as JSON Schema under docs/cli/ (decision 0047: a field
added keeps the version, a field removed, renamed or retyped raises it).

Error lines: ``error: <Reason>: <what happened, naming its file once>; what to do: <…>``
on stderr (``error_line``). The message comes from the error, which names the file it is
about; the hint is ``HINTS[reason]`` (docs/cli.md, "Errors", lists them), so every line
carries ``what to do:``, whatever the error's message says itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, Final

from nodeagent.strict import clip

SCHEMA_VERSIONS: Final[Mapping[str, int]] = {
    "check-config": 1,
    "render-pins": 1,
    "render-mirror-dropin": 1,
    "status": 1,
    "runtime": 1,
    "check-offline": 1,
    "pull": 1,
    "bundle-create": 1,
    "bundle-create-dry-run": 1,
    "bundle-remove": 1,
    "bundle-verify": 1,
    "bundle-import": 1,
    "bundle-keygen": 1,
    "store": 1,
    "store-verify": 1,
    "site-status": 1,
    "site-wait": 1,
    "completion": 1,
    "unpin": 1,
    "support-dump": 1,
}
"""Each command's ``--json`` document and its version (``bundle release-signatures --json``
prints a Kubernetes ConfigMap, whose apiVersion and kind say what it is)."""

_MESSAGE_CHARS = 2000

HINTS: Final[Mapping[str, str]] = {
    "ConfigInvalid": "fix the file, then run `nodeagent check-config` again",
    "SpecInvalid": "fix or remove the file, then run `nodeagent check-config` again; "
    "until then the sets it held stay as they were",
    "ImageReferenceInvalid": "name every image by digest (NAME@sha256:<64 hex>), then run "
    "`nodeagent check-config` again",
    "AuthFileInvalid": 'fix the file (a docker config.json: {"auths": {HOST: {"auth": '
    "base64(user:password)}}}) or pass another with --auth-file",
    "SigningKeyMalformed": "pass the minisign key file as `minisign -G` wrote it, or an ECDSA "
    "P-256/P-384 key in PEM (a trusted .pem: the public key; --ecdsa-key: the private one)",
    "SigningKeyLocked": "pass the key's password with --password-file, or run on a terminal",
    "BundleIncomplete": "copy the bundle again with `nodeagent bundle create`, or name a "
    "bundle directory or a stored id (`nodeagent store` lists them)",
    "HostFileError": "check that the path exists and nodeagent may read it",
    "StateFileDamaged": "wait for the daemon's next sync, or restart nodeagent: it sets the "
    "file aside and rebuilds it",
    "KubeconfigInvalid": "pass a readable kubeconfig with --kubeconfig",
    "DaemonRunning": "plug the stick in: the daemon imports it by itself (`nodeagent status` "
    "shows it); to import or remove a bundle by hand, stop the daemon first (systemctl stop "
    "nodeagent) and start it again after",
    "SetNotFound": "name a set `nodeagent status` lists",
    "SetFromApi": "remove it in the cluster (oc delete pinnedimageset NAME, or change its "
    "node selector): the node unpins it at its next sync",
    "SetFileShared": "edit the file and take the set out (or move it to a file of its own): "
    "the daemon unpins it at its next sync",
    "BundleNotStored": "name a bundle `nodeagent store` lists",
    "BundleSetsPinned": "unpin its sets first (`nodeagent unpin SET`), then remove it",
    "ReleaseInUse": "wait until the upgrade has completed on every pool (oc get clusterversion; "
    "oc get mcp); the current and desired releases are never removed",
    "StickNotFound": "plug in one stick labelled as [bundles] label_pattern says (NODEAGENT*), "
    "ext4 or vfat, and only one; or give --output PATH",
    "JournalUnreadable": "check `journalctl -u nodeagent` by hand and attach its output",
    "ReleaseStateUnknown": "run it again once the node reaches the API server (cluster mode); "
    "until then retirement decides when a release goes (docs/upgrade.md)",
    "SiteCertificatesInvalid": "point [site] cert_file, key_file, client_cert_file, "
    "client_key_file and ca_file at the node's certificates (the kubelet's), or turn that "
    "[site] role off",
    "ApiUnreachable": "check the API server's address in the kubeconfig and the network",
    "ApiAccessDenied": "use credentials that may list Nodes and NodeImageStatuses",
    "RuntimeUnreachable": "start CRI-O (systemctl start crio) or fix [runtime] endpoint",
    "RuntimeTimeout": "check CRI-O (journalctl -u crio), then run the command again",
    "RuntimeCallFailed": "read CRI-O's reason above and its journal (journalctl -u crio)",
    "RegistriesConfInvalid": "fix the named registries.conf file: every pull on the node fails "
    "until then; nodeagent writes its mirror drop-in again when it changes",
    "RuntimeConfigInvalid": "fix the named CRI-O file: CRI-O refuses to start until then",
    "RegistryUnavailable": "check the registry's address and the network, then try again",
    "RegistryError": "try again later; the registry failed on its side",
    "RegistryAuthFailed": "put credentials for the registry in the auth file",
    "ImageNotFound": "check the image reference: the registry has no such digest",
    "ReleaseImageInvalid": "name the release by digest (oc adm release info PULLSPEC)",
    "ReleaseUnsigned": "carry the release's signatures: --release-signature FILE or "
    "--signature-dir DIR (a release signature store); --require-signatures refuses without",
    "ReleaseNotAnUpgrade": "bundle the release the update graph gives for the cluster's version "
    "(oc get clusterversion; docs/upgrade.md)",
    "ImageRefused": "read the line's reason; the bundle's other images are imported and pinned",
    "ImageSignatureInvalid": "sign the image's statement with an agent image key "
    "(tools/build_image.py --sign-key) whose .pem is in /etc/nodeagent/image-keys.d",
    "ImageStatementInvalid": "make the statement again with tools/build_image.py --sign-key",
    "ImageDigestMismatch": "sign the statement of the image the bundle carries "
    "(its manifest digest)",
    "ImageRollback": "carry an image of a higher sequence (tools/build_image.py --sequence)",
    "ImageStageFailed": "check the disk under /var/lib/nodeagent and the store "
    "(nodeagent store verify); import the bundle again",
    "BundleUnsigned": "sign the bundle: make it again with `nodeagent bundle create --key`",
    "BundleSignatureMalformed": "make the bundle again with `nodeagent bundle create`",
    "BundleSignatureInvalid": "the bundle was changed after signing: make or copy it again",
    "Ed25519Refused": "this node (FIPS mode) needs the bundle's ECDSA signature: make it with "
    "`bundle create --ecdsa-key` and trust the key's .pem (decision 0075); `nodeagent "
    "check-config` shows the FIPS mode",
    "BundleSignedByUnknownKey": "put the signer's .pub (minisign) or .pem (ECDSA) key in the "
    "trusted keys directory, or pass it with --trusted-keys",
    "BundleManifestInvalid": "make the bundle again with `nodeagent bundle create`",
    "BundleDigestMismatch": "copy the bundle again: a file's bytes are not the signed ones",
    "BundleSizeMismatch": "copy the bundle again: a file's size is not the signed one",
    "BundleArchitectureMismatch": "make a bundle for this node's architecture (--arch)",
    "BundleNotInTarget": "pass --ignore-target to import it on this node anyway",
    "BundleRollback": "pass --allow-rollback to go back on purpose",
    "BundleExpired": "make a new bundle, or pass --allow-expired",
    "MediaMountFailed": "check the device or label (lsblk -f lists them), or plug the stick "
    "into another port; an ext4 or vfat stick labelled NODEAGENT is what nodeagent mounts",
    "MediaUnmountFailed": "close what still reads the stick, then pull it; it was detached, "
    "so the node is not harmed",
    "UsageInvalid": "run the command with --help: it lists what it takes",
    "InternalError": "this is a defect in nodeagent: report the command line and this line, "
    "with `nodeagent status --json`",
    "StatusMissing": "check that the service runs (systemctl status nodeagent); the first "
    "status is written once its first sync ends",
    "StoreBlobCorrupt": "plug the bundle's medium in again to restore the blobs; check the disk",
    "InsufficientDiskSpace": "free space on the image filesystem, or lower [disk] reserve",
    "NoSpaceLeft": "free space on the named filesystem, then try again",
}
"""What to do, per reason code (the reasons a command line can meet; docs/cli.md lists them)."""


def schema_id(command: str) -> str:
    """``nodeagent.status/v1``."""
    return f"nodeagent.{command}/v{SCHEMA_VERSIONS[command]}"


def document(command: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with its ``schema`` first."""
    return {"schema": schema_id(command)} | {k: v for k, v in body.items() if k != "schema"}


def print_json(command: str, body: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(document(command, body), indent=2) + "\n")


def hint_for(reason: str) -> str:
    """What to do about an error of ``reason``."""
    return HINTS.get(reason, f"look {reason} up in docs/cli.md, 'Errors'")


def error_line(reason: str, message: str, *, prefix: str = "error") -> str:
    """``error: Reason: message; what to do: hint`` (the message clipped and escaped)."""
    return f"{prefix}: {reason}: {clip(message, _MESSAGE_CHARS)}; what to do: {hint_for(reason)}"


def print_error(reason: str, message: str, *, prefix: str = "error") -> None:
    sys.stderr.write(error_line(reason, message, prefix=prefix) + "\n")
