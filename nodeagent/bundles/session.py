"""The loopback mirror's session process and the daemon: what each tells the other.

An import or a restore serves the store on loopback for the length of one mirror session
(``serving``). The server runs in a process of its own (``nodeagent serve-session``,
decision 0064), unprivileged where systemd starts it, and the two speak over one unix
stream socket, one JSON object a line:

- the daemon sends one ``SessionSpec`` (``render_spec``), then shuts its side for writing
  to end the session (or the process gets SIGTERM). ``arrival_wait_s`` (optional, 0 when
  absent) lets a listed file that is not there yet be awaited that long before it is
  refused: an import serves the store while its copy from the medium still runs
  (decision 0079);
- the process answers ``listening`` (its port, pid and uid), then ``counters`` whenever
  they moved, ``rejected`` for each blob that failed its digest or its size while it was
  sent, and ``closed`` with the final counters once every response in progress ended.

Both sides parse strictly (``parse_spec``, ``parse_report``): each line is bounded,
every key is known, every value range-checked. A session process is not trusted more
than its input: counters that go down and a rejection with a reason code that is not a
blob's are refused like a malformed line, and the daemon ends the session.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.strict import MalformedInput, clip, loads_json

SPEC_VERSION: Final = 1
MAX_SPEC_BYTES: Final = 64 << 20
"""Longest spec line (64 MiB: a store of 200,000 blobs at about 200 bytes each)."""
MAX_FILES: Final = 200_000
"""Blobs one session serves at most (a release bundle has about 1,000)."""
MAX_TAGS: Final = 20_000
MAX_PATH_CHARS: Final = 1024
MAX_NAME_CHARS: Final = 512
MAX_REPORT_BYTES: Final = 2048
"""Longest report line of the session process; a longer one is refused."""
MAX_MESSAGE_CHARS: Final = 500
"""A rejection's message is clipped to this."""
MAX_COUNT: Final = 1 << 60
MAX_ARRIVAL_WAIT_S: Final = 3600
_OPTIONAL_SPEC_KEYS: Final = frozenset({"arrival_wait_s"})
"""Longest wait for a listed file not there yet (a release copied from a slow stick: minutes)."""

_DIGEST: Final = re.compile(r"sha256:[a-f0-9]{64}")
_HEX: Final = re.compile(r"[a-f0-9]{64}")

Event = Literal["listening", "counters", "rejected", "closed"]


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What one session serves: ``files`` (digest → file under ``root``) and ``tags``
    (``<repository>/<tag>`` → one of those digests), on 127.0.0.1:``port`` (0: any)."""

    root: str
    files: Mapping[str, ExpectedFile]
    tags: Mapping[str, str]
    port: int = 0
    arrival_wait_s: int = 0
    """Seconds a request for a listed file that is not there yet waits for it (0: none)."""


@dataclass(frozen=True, slots=True)
class SessionReport:
    """One line of the session process. ``listening``: ``port``, ``pid``, ``uid``;
    ``counters`` and ``closed``: ``requests``, ``bytes_served``; ``rejected``: ``digest``,
    ``reason``, ``message``."""

    event: Event
    port: int = 0
    pid: int = 0
    uid: int = 0
    requests: int = 0
    bytes_served: int = 0
    digest: str = ""
    reason: str = ""
    message: str = ""


def render_spec(spec: SessionSpec) -> bytes:
    files = {d: [f.path, f.size_bytes, f.sha256_hex] for d, f in spec.files.items()}
    body: dict[str, Any] = {"version": SPEC_VERSION, "root": spec.root, "port": spec.port,
                            "files": files, "tags": dict(spec.tags)}  # fmt: skip
    if spec.arrival_wait_s:
        body["arrival_wait_s"] = spec.arrival_wait_s
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def parse_spec(data: bytes) -> SessionSpec:
    """A spec line, or ``MalformedInput``."""
    body = _object(loads_json(data, what="session spec", max_bytes=MAX_SPEC_BYTES, max_depth=4))
    _keys(body, {"version", "root", "port", "files", "tags"}, "session spec", _OPTIONAL_SPEC_KEYS)
    if body["version"] != SPEC_VERSION:
        raise MalformedInput(f"session spec version {clip(body['version'], 20)} is not 1")
    root = body["root"]
    if not isinstance(root, str) or not root.startswith("/") or len(root) > MAX_PATH_CHARS:
        raise MalformedInput("session spec root is not an absolute path")
    files_in, tags_in = _object(body["files"]), _object(body["tags"])
    if len(files_in) > MAX_FILES or len(tags_in) > MAX_TAGS:
        raise MalformedInput("session spec lists too many files or tags")
    files = {_digest(d): _file(f) for d, f in files_in.items()}
    tags = {_name(n): _digest(d) for n, d in tags_in.items()}
    if any(d not in files for d in tags.values()):
        raise MalformedInput("a session spec tag names a digest it does not serve")
    arrival_wait_s = _int(body.get("arrival_wait_s", 0), MAX_ARRIVAL_WAIT_S)
    return SessionSpec(root, files, tags, _int(body["port"], 65535), arrival_wait_s)


def render_report(report: SessionReport) -> bytes:
    fields: dict[str, Any] = {"event": report.event}
    if report.event == "listening":
        fields |= {"port": report.port, "pid": report.pid, "uid": report.uid}
    elif report.event == "rejected":
        message = clip(report.message, MAX_MESSAGE_CHARS)
        fields |= {"digest": report.digest, "reason": report.reason, "message": message}
    else:
        fields |= {"requests": report.requests, "bytes_served": report.bytes_served}
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


_REPORT_KEYS: Final[dict[str, set[str]]] = {
    "listening": {"event", "port", "pid", "uid"},
    "counters": {"event", "requests", "bytes_served"},
    "closed": {"event", "requests", "bytes_served"},
    "rejected": {"event", "digest", "reason", "message"},
}


def parse_report(line: bytes, reasons: frozenset[str]) -> SessionReport:
    """One report line, or ``MalformedInput``; ``reasons``: the reason codes a rejection
    may carry (a blob's: ``BundleDigestMismatch``, ``BundleSizeMismatch``, ...)."""
    body = _object(loads_json(line, what="session report", max_bytes=MAX_REPORT_BYTES))
    event = body.get("event")
    if not isinstance(event, str) or event not in _REPORT_KEYS:
        raise MalformedInput(f"session report event {clip(event, 40)} is unknown")
    _keys(body, _REPORT_KEYS[event], f"session report {event}")
    if event == "listening":
        port = _int(body["port"], 65535)
        if port == 0:
            raise MalformedInput("session report listening: port 0")
        return SessionReport("listening", port=port, pid=_int(body["pid"], 1 << 22),
                             uid=_int(body["uid"], (1 << 32) - 1))  # fmt: skip
    if event == "rejected":
        reason, message = body["reason"], body["message"]
        if not isinstance(reason, str) or reason not in reasons:
            raise MalformedInput(f"session report rejected: reason {clip(reason, 60)} unknown")
        if not isinstance(message, str):
            raise MalformedInput("session report rejected: message is not text")
        return SessionReport("rejected", digest=_digest(body["digest"]), reason=reason,
                             message=clip(message, MAX_MESSAGE_CHARS))  # fmt: skip
    requests, served = _int(body["requests"], MAX_COUNT), _int(body["bytes_served"], MAX_COUNT)
    return SessionReport("closed" if event == "closed" else "counters",
                         requests=requests, bytes_served=served)  # fmt: skip


def _object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedInput("not a JSON object")
    return value


def _keys(
    body: Mapping[str, object], wanted: set[str], what: str, optional: frozenset[str] = frozenset()
) -> None:
    if not wanted <= set(body) <= wanted | optional:
        odd = sorted((set(body) - optional) ^ wanted)
        raise MalformedInput(f"{what}: keys {clip(', '.join(odd), 120)} missing or unknown")


def _int(value: object, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise MalformedInput(f"{clip(value, 30)} is not a whole number from 0 to {maximum}")
    return value


def _digest(value: object) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise MalformedInput(f"{clip(value, 80)} is not a sha256 digest")
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise MalformedInput("a session spec tag name is empty or too long")
    return value


def _file(value: object) -> ExpectedFile:
    if not isinstance(value, list) or len(value) != 3:
        raise MalformedInput("a session spec file is not [path, size, sha256]")
    path, size, hex_digest = value
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_CHARS:
        raise MalformedInput("a session spec file path is empty or too long")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or any(p in ("..", ".") for p in parts) or "\x00" in path:
        raise MalformedInput(f"session spec file path {clip(path, 80)} leaves its root")
    if not isinstance(hex_digest, str) or not _HEX.fullmatch(hex_digest):
        raise MalformedInput("a session spec file's sha256 is not 64 hex digits")
    return ExpectedFile(path, _int(size, MAX_COUNT), hex_digest)
