"""Log lines as a technician reads them in the journal."""

from __future__ import annotations

import io

import pytest
import structlog

from nodeagent import logs


@pytest.mark.parametrize(
    ("event", "with_priority", "expected"),
    [
        (
            {"event": "image_pulled", "level": "info", "image": "q.io/a@sha256:1", "seconds": 1.5},
            False,
            "image_pulled: image=q.io/a@sha256:1 seconds=1.5",
        ),
        (
            {"event": "image_pulled", "level": "info", "image": "x"},
            True,
            "<6>image_pulled: image=x",
        ),
        (
            {"event": "disk_refused", "level": "error", "error": 'needs 1 GiB, "x"'},
            True,
            '<3>Not enough disk space for the images. disk_refused: error="needs 1 GiB, \\"x\\""',
        ),
        (
            {"event": "disk_refused", "level": "error", "error": "full"},
            False,
            "ERROR Not enough disk space for the images. disk_refused: error=full",
        ),
        (
            {"event": "pull_retrying", "level": "warning", "reason": "RegistryUnavailable"},
            False,
            "WARNING pull_retrying: reason=RegistryUnavailable",
        ),
        ({"event": "daemon_started", "level": "info"}, False, "daemon_started"),
        ({"event": "x", "level": "debug", "empty": ""}, True, '<7>x: empty=""'),
    ],
)
def test_render_line(event: dict[str, object], with_priority: bool, expected: str) -> None:
    assert logs.render_line(dict(event), with_priority=with_priority) == expected


def test_configure_filters_below_level_and_writes_one_line_per_event() -> None:
    out = io.StringIO()
    logs.configure("warning", out)
    try:
        log = structlog.get_logger("t")
        log.info("set_pinned", set="a")
        log.warning("pull_retrying", image="b", attempt=2)
    finally:
        structlog.reset_defaults()
    assert out.getvalue() == "WARNING pull_retrying: image=b attempt=2\n"
