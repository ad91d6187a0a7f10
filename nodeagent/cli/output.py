"""What every command prints the same way: its ``--json`` document and its error lines.

``--json``: one JSON object on stdout whose first field ``schema`` names the document's
kind and version, ``nodeagent.<command>/v<N>`` (``SCHEMA_VERSIONS``); the schemas are
documented in docs/cli.md and kept as JSON Schema under docs/cli/ (decision 0047: a field
added keeps the version, a field removed, renamed or retyped raises it).

Error lines: ``error: <Reason>: <what happened, naming its file once>; what to do: <…>``
on stderr (``error_line``). The message comes from the error, which names the file it is
about; the hint is the error's own when its message gives one, else ``HINTS[reason]``.
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
    "status": 1,
    "runtime": 1,
    "check-offline": 1,
    "pull": 1,
    "bundle-create": 1,
    "bundle-verify": 1,
    "bundle-import": 1,
    "store": 1,
    "store-verify": 1,
    "site-status": 1,
    "site-wait": 1,
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
    "SigningKeyMalformed": "pass the minisign secret key file that `minisign -G` wrote",
    "SigningKeyLocked": "pass the key's password with --password-file, or run on a terminal",
    "BundleIncomplete": "copy the bundle again with `nodeagent bundle create`, or name a "
    "bundle directory or a stored id (`nodeagent store` lists them)",
    "HostFileError": "check that the path exists and nodeagent may read it",
    "StateFileDamaged": "wait for the daemon's next sync, or restart nodeagent: it sets the "
    "file aside and rebuilds it",
    "KubeconfigInvalid": "pass a readable kubeconfig with --kubeconfig",
    "ApiUnreachable": "check the API server's address in the kubeconfig and the network",
    "ApiAccessDenied": "use credentials that may list Nodes and NodeImageStatuses",
    "RuntimeUnreachable": "start CRI-O (systemctl start crio) or fix [runtime] endpoint",
}
"""What to do, per reason code, when the error's message does not say it already."""

_SAYS_WHAT_TO_DO = (
    "what to do",
    "; fix",
    "; run",
    "; pass",
    "; use",
    "; remove",
    "; copy",
    "; plug",
    "; check",
    "; install",
    "; add",
    "; set",
    "; name",
    "; restart",
    "sets it aside",
    "; try",
    "did you mean",
    "lists the stored",
)


def schema_id(command: str) -> str:
    """``nodeagent.status/v1``."""
    return f"nodeagent.{command}/v{SCHEMA_VERSIONS[command]}"


def document(command: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with its ``schema`` first."""
    return {"schema": schema_id(command)} | {k: v for k, v in body.items() if k != "schema"}


def print_json(command: str, body: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(document(command, body), indent=2) + "\n")


def hint_for(reason: str, message: str) -> str | None:
    """What to do, unless ``message`` already says it."""
    lowered = message.lower()
    if any(marker in lowered for marker in _SAYS_WHAT_TO_DO):
        return None
    return HINTS.get(reason, f"look {reason} up in docs/cli.md, 'Errors'")


def error_line(reason: str, message: str, *, prefix: str = "error") -> str:
    """``error: Reason: message; what to do: hint`` (the message clipped and escaped)."""
    text = f"{prefix}: {reason}: {clip(message, _MESSAGE_CHARS)}"
    hint = hint_for(reason, message)
    return text if hint is None else f"{text}; what to do: {hint}"


def print_error(reason: str, message: str, *, prefix: str = "error") -> None:
    sys.stderr.write(error_line(reason, message, prefix=prefix) + "\n")
