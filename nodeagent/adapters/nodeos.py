"""Reads the node's OS image: ``/etc/os-release`` and the image tools' JSON (``nodeos``).

The tools run without a shell, with stdin closed, ``LC_ALL=C`` and a bounded time; their
output is read up to ``nodeos.MAX_TOOL_OUTPUT_BYTES`` (a longer one is refused) and parsed
strictly. A tool that is not installed is normal (most hosts have neither); one that fails,
hangs or prints something else is logged once and its part left out.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import structlog

from nodeagent.nodeos import (
    MAX_OS_RELEASE_BYTES,
    MAX_TOOL_OUTPUT_BYTES,
    BootedImage,
    OsImage,
    booted_from_bootc,
    booted_from_rpm_ostree,
    os_image,
)
from nodeagent.strict import MalformedInput, clip

log = structlog.get_logger(__name__)

MAX_STDERR_BYTES = 4096
"""What a failing tool said, kept for the journal (clipped)."""


class ToolFailed(Exception):
    """A tool ran but gave no usable answer (exit status, timeout, too much output)."""


async def run_tool(argv: list[str], *, timeout_s: float, max_bytes: int) -> bytes:
    """``argv``'s standard output; ``ToolFailed`` unless it exits 0 within ``timeout_s``
    having printed at most ``max_bytes``. The process is killed on any early end."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await _collect(process, max_bytes)
        async with asyncio.timeout(timeout_s):
            code = await process.wait()
    except TimeoutError:
        raise ToolFailed(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if code != 0:
        said = clip(err.decode(errors="replace").strip(), 300)
        raise ToolFailed(f"{' '.join(argv)} exited with status {code}: {said}")
    return out


async def _collect(process: asyncio.subprocess.Process, max_bytes: int) -> tuple[bytes, bytes]:
    assert process.stdout is not None and process.stderr is not None  # noqa: S101 (PIPE above)
    err_task = asyncio.ensure_future(process.stderr.read(MAX_STDERR_BYTES))
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := await process.stdout.read(64 << 10):
            size += len(chunk)
            if size > max_bytes:
                raise ToolFailed(f"printed more than {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks), await err_task
    finally:
        err_task.cancel()


class NodeOsReader:
    """``daemon`` reads the OS image through this: one ``read()`` per interval."""

    def __init__(
        self, *, os_release: Path, bootc: Path, rpm_ostree: Path, timeout_s: float
    ) -> None:
        self.os_release = os_release
        self.bootc = bootc
        self.rpm_ostree = rpm_ostree
        self.timeout_s = timeout_s
        self._problems: dict[str, str] = {}

    async def read(self) -> OsImage:
        release = await asyncio.to_thread(self._os_release)
        bootc = await self._booted("bootc", [str(self.bootc), "status", "--format", "json"])
        rpm_ostree = None
        if bootc is None:
            argv = [str(self.rpm_ostree), "status", "--json"]
            rpm_ostree = await self._booted("rpm-ostree", argv)
        return os_image(release, bootc=bootc, rpm_ostree=rpm_ostree)

    def _os_release(self) -> str | None:
        try:
            with self.os_release.open("rb") as stream:
                data = stream.read(MAX_OS_RELEASE_BYTES + 1)
        except FileNotFoundError:  # os-release(5) is optional: the status leaves it out
            self._problem("os-release", None)
            return None
        except OSError as exc:
            self._problem("os-release", f"cannot read {self.os_release}: {exc.strerror}")
            return None
        if len(data) > MAX_OS_RELEASE_BYTES:
            self._problem("os-release", f"{self.os_release} is over {MAX_OS_RELEASE_BYTES} bytes")
            return None
        self._problem("os-release", None)
        return data.decode("utf-8", errors="replace")

    async def _booted(self, tool: str, argv: list[str]) -> BootedImage | None:
        if not await asyncio.to_thread(Path(argv[0]).is_file):
            return None  # not an image-based host, or another tool: nothing to say
        parse = booted_from_bootc if tool == "bootc" else booted_from_rpm_ostree
        try:
            out = await run_tool(argv, timeout_s=self.timeout_s, max_bytes=MAX_TOOL_OUTPUT_BYTES)
            found = parse(out)
        except (ToolFailed, MalformedInput, OSError) as exc:
            self._problem(tool, str(exc))
            return None
        self._problem(tool, None)
        return found

    def _problem(self, source: str, error: str | None) -> None:
        """Log a source's failure once, and its recovery once."""
        before = self._problems.get(source)
        if error is None:
            if before is not None:
                log.info("node_os_source_recovered", source=source)
                del self._problems[source]
            return
        if before != error:
            log.warning(
                "node_os_source_failed",
                source=source,
                error=clip(error, 400),
                action="the status leaves this part of osImage out; it is read again later",
            )
            self._problems[source] = error
