"""UnreachableHosts: a failure is remembered per host and scheme, for a while or a sync."""

from __future__ import annotations

import pytest

from nodeagent.adapters.registry.unreachable import UnreachableHosts
from nodeagent.errors import RegistryUnavailable

REF = "mirror.example:5000/app@sha256:" + "a" * 64


def test_a_noted_host_fails_at_once_with_the_first_reason_until_its_memory_ends() -> None:
    now = [100.0]
    hosts = UnreachableHosts(300.0, lambda: now[0])
    hosts.check(REF, "mirror.example:5000", "https")  # nothing noted: no error
    hosts.note("mirror.example:5000", "https", "timed out")
    now[0] += 299.0
    with pytest.raises(RegistryUnavailable) as caught:
        hosts.check(REF, "mirror.example:5000", "https")
    assert caught.value.reason == "RegistryUnavailable"
    assert REF in caught.value.message and "(timed out)" in caught.value.message
    assert "299 s ago" in caught.value.message
    hosts.check(REF, "mirror.example:5000", "http")  # another scheme: asked again
    hosts.check(REF, "other.example", "https")  # another host: asked
    now[0] += 1.0
    hosts.check(REF, "mirror.example:5000", "https")  # memory over: asked again


def test_forget_starts_over_and_a_clock_going_back_does_not_keep_a_host_out() -> None:
    now = [50.0]
    hosts = UnreachableHosts(300.0, lambda: now[0])
    hosts.note("a.example", "https", "refused")
    hosts.forget()
    hosts.check(REF, "a.example", "https")
    hosts.note("a.example", "https", "refused")
    now[0] = 10.0
    hosts.check(REF, "a.example", "https")
