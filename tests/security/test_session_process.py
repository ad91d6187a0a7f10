"""A mirror session's server process is not trusted by the daemon (decision 0064).

The process serving an import runs apart from the root daemon, unprivileged in production;
what it sends back is input. A process that sends a line the daemon refuses (not JSON, an
unknown event, counters that go down, a rejection of a digest it does not serve or with a
reason that is not a blob's, an endless line) stops the session with
``BundleServerReportInvalid`` and is killed; one that dies is ``BundleServerLost``; one
that never says it listens is given up after the start timeout. Never a hang.

The hostile processes here are small scripts given to the real ``ChildLauncher``; the
real ``nodeagent serve-session`` is killed mid-session as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from nodeagent.adapters.bundles import session_server
from nodeagent.adapters.bundles.session_server import ChildLauncher, SessionServer
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.daemon.bundles import session_command
from nodeagent.errors import BundleServerLost, BundleServerReportInvalid
from tests.testenv.waiting import wait_for_async

BODY = b"layer bytes"
HEX = hashlib.sha256(BODY).hexdigest()
DIGEST = f"sha256:{HEX}"
OTHER = f"sha256:{'cd' * 32}"
LISTENING = '{"event":"listening","port":4242,"pid":1,"uid":0}'


def hostile(*lines: str, then: str = "sys.stdin.buffer.read()") -> list[str]:
    """A session process that reads the spec, writes ``lines`` raw, then does ``then``."""
    script = (
        "import sys, os\n"
        "sys.stdin.buffer.readline()\n"
        f"for line in {list(lines)!r}:\n"
        "    os.write(1, line.encode())\n"
        f"{then}\n"
    )
    return [sys.executable, "-c", script]


async def rejected(server: SessionServer) -> None:
    async def check() -> bool:
        return bool(server.rejections)

    await wait_for_async(check, timeout_s=10, interval_s=0.02, what="the session's failure")


def store(tmp_path: Path) -> dict[str, ExpectedFile]:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "a").write_bytes(BODY)
    return {DIGEST: ExpectedFile("blobs/a", len(BODY), HEX)}


@pytest.mark.parametrize(
    "line",
    [
        "not json\n",
        '{"event":"exploded"}\n',
        '{"event":"counters","requests":5,"bytes_served":9}\n'
        '{"event":"counters","requests":4,"bytes_served":9}\n',
        '{"event":"rejected","digest":"' + OTHER + '","reason":"BundleDigestMismatch",'
        '"message":"a digest it does not serve"}\n',
        '{"event":"rejected","digest":"' + DIGEST + '","reason":"StoreFull","message":"x"}\n',
        '{"event":"rejected","digest":"' + DIGEST + '","reason":"BundleServerLost",'
        '"message":"the server pretending to be the daemon"}\n',
        LISTENING + "\n",  # listening twice
        '{"event":"closed","requests":1,"bytes_served":1}\n{"event":"counters",'
        '"requests":1,"bytes_served":1}\n',  # a report after closed
        "x" * 100_000,  # an endless line
    ],
    ids=[
        "not-json",
        "unknown-event",
        "counters-down",
        "unserved-digest",
        "not-a-blobs-reason",
        "server-reason",
        "listening-twice",
        "after-closed",
        "endless-line",
    ],
)
async def test_a_report_the_daemon_refuses_stops_the_session_and_the_process(
    tmp_path: Path, line: str
) -> None:
    server = SessionServer(
        ChildLauncher(hostile(LISTENING + "\n", line)), tmp_path, store(tmp_path)
    )
    await server.start()
    started = time.monotonic()
    await rejected(server)
    refused = server.rejections
    assert [type(r) for r in refused] == [BundleServerReportInvalid], refused
    await server.close()
    assert time.monotonic() - started < 10  # killed, not waited for
    assert server.requests_seen() != 4  # what was refused is not counted (counters-down)


async def test_a_report_before_listening_fails_the_start(tmp_path: Path) -> None:
    line = '{"event":"counters","requests":1,"bytes_served":1}\n'
    server = SessionServer(ChildLauncher(hostile(line)), tmp_path, store(tmp_path))
    with pytest.raises(BundleServerLost, match="before listening"):
        await server.start()


async def test_a_process_that_never_listens_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_server, "START_TIMEOUT_S", 1.0)
    server = SessionServer(ChildLauncher(hostile()), tmp_path, store(tmp_path))
    started = time.monotonic()
    with pytest.raises(BundleServerLost, match="did not start"):
        await server.start()
    assert time.monotonic() - started < 5


async def test_a_process_that_ends_before_closing_is_lost(tmp_path: Path) -> None:
    server = SessionServer(
        ChildLauncher(hostile(LISTENING + "\n", then="pass")), tmp_path, store(tmp_path)
    )
    await server.start()
    await rejected(server)
    assert [type(r) for r in server.rejections] == [BundleServerLost]
    await server.close()


async def test_the_real_session_process_killed_mid_session_is_lost_and_closes_at_once(
    tmp_path: Path,
) -> None:
    server = SessionServer(
        ChildLauncher(session_command(tmp_path / "no-config.toml")), tmp_path, store(tmp_path)
    )
    await server.start()
    assert server.pid not in (0, os.getpid())
    reader, writer = await asyncio.open_connection(*server.mirror_host.split(":"))
    writer.write(f"GET /v2/r/blobs/{DIGEST} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert await reader.readexactly(len(BODY)) == BODY
    writer.close()
    os.kill(server.pid, signal.SIGKILL)
    started = time.monotonic()
    await rejected(server)
    assert [r.reason for r in server.rejections] == ["BundleServerLost"]
    await server.close()
    assert time.monotonic() - started < 5
    with pytest.raises(OSError):  # nothing listens there any more
        await asyncio.open_connection(*server.mirror_host.split(":"))
