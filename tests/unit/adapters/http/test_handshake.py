"""Refused handshakes: the words a technician reads, and one line per peer per minute."""

from __future__ import annotations

import ssl

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.http.handshake import QUIET_S, RefusalLog, refusal_reason


def verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    err = ssl.SSLCertVerificationError(1, f"certificate verify failed: {message}")
    err.verify_code, err.verify_message = code, message
    return err


def openssl_error(reason: str) -> ssl.SSLError:
    err = ssl.SSLError(1, f"[SSL: {reason}] {reason.lower()}")
    err.reason = reason
    return err


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (verify_error(20, "unable to get local issuer certificate"), "not signed by the site CA"),
        (verify_error(10, "certificate has expired"), "certificate expired"),
        (verify_error(9, "certificate is not yet valid"), "not valid yet (check the clocks)"),
        (verify_error(99, "odd\x1b[31m"), "certificate refused: odd"),
        (openssl_error("PEER_DID_NOT_RETURN_A_CERTIFICATE"), "no client certificate sent"),
        (openssl_error("HTTP_REQUEST"), "plain HTTP sent to the HTTPS port"),
        (openssl_error("TLSV1_ALERT_UNKNOWN_CA"), "does not trust this node's certificate"),
        (openssl_error("SOMETHING_NEW"), "TLS handshake failed: SOMETHING_NEW"),
        (TimeoutError(), "handshake not finished within 20 s"),
        (ConnectionResetError(), "connection closed during the handshake"),
    ],
)
def test_reasons_read_as_words(exc: BaseException, words: str) -> None:
    reason = refusal_reason(exc, 20.0)
    assert words in reason
    assert "\x1b" not in reason


def test_one_line_per_address_per_minute_then_the_count_of_the_quiet_ones() -> None:
    now = [1000.0]
    refusals = RefusalLog(lambda: now[0])
    with capture_logs() as logs:
        assert refusals.refused("10.0.0.7", "certificate expired")
        assert refusals.refused("10.0.0.8", "no client certificate sent")  # its own address
        now[0] += QUIET_S - 1
        assert not refusals.refused("10.0.0.7", "certificate expired")
        assert not refusals.refused("10.0.0.7", "certificate expired")
        now[0] += 1
        assert refusals.refused("10.0.0.7", "certificate expired")
        now[0] += QUIET_S
        assert refusals.refused("10.0.0.7", "certificate expired")
    assert [(e["address"], e.get("not_logged_since")) for e in logs] == [
        ("10.0.0.7", None),
        ("10.0.0.8", None),
        ("10.0.0.7", 2),
        ("10.0.0.7", None),
    ]
