"""``config.redact``: what ``support-dump`` puts in its archive carries no secret (decision
0072): values named like secrets, URL user information, ``key=value`` secrets and
authorization headers in journal text, PEM private keys; and the rest unchanged."""

from __future__ import annotations

import time

from nodeagent.config.redact import REDACTED, redact_doc, redact_text


def test_values_named_like_secrets_are_redacted_and_paths_kept() -> None:
    doc = {
        "site": {"key_file": "/etc/pki/site.key", "password": "hunter2", "api_token": "abc"},
        "pull": {"auth_file": "/var/lib/kubelet/config.json", "registry_auth": "dXNlcjpwdw=="},
        "peers": ["https://user:hunter3@peer.example:9447"],
        "gc_grace_s": 3600,
    }
    out = redact_doc(doc)
    assert out == {
        "site": {"key_file": "/etc/pki/site.key", "password": REDACTED, "api_token": REDACTED},
        "pull": {"auth_file": "/var/lib/kubelet/config.json", "registry_auth": REDACTED},
        "peers": [f"https://{REDACTED}@peer.example:9447"],
        "gc_grace_s": 3600,
    }


def test_journal_text_loses_its_secrets_and_keeps_the_rest() -> None:
    text = (
        "2026-11-28T10:00:00+0000 node nodeagent[1]: pull_failed: image=reg.example/a@sha256:ab "
        'password=hunter2 token: "s3cr3t" client_secret=xyz\n'
        "Authorization: Bearer eyJhbGciOi.payload.sig\n"
        "fetched https://bob:pw@mirror.example/v2/ in 3 s\n"
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----\n"
    )
    out = redact_text(text)
    for secret in ("hunter2", "s3cr3t", "xyz", "eyJhbGciOi", "bob:pw", "MHcCAQEEIB"):
        assert secret not in out
    assert "pull_failed: image=reg.example/a@sha256:ab" in out
    assert "fetched https://<redacted>@mirror.example/v2/ in 3 s" in out


def test_redaction_is_linear_on_hostile_text() -> None:
    hostile = ("password=" + "a" * 5000 + " ") * 200 + "://" + "x" * 100_000
    started = time.monotonic()
    redact_text(hostile)
    assert time.monotonic() - started < 2.0
