"""Connection admission: caps in total and per source, the allow-list, one line per transition."""

from __future__ import annotations

import ipaddress

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.http.admission import (
    MAX_TRACKED,
    UNKNOWN,
    Caps,
    Door,
    is_allowed,
    parse_networks,
    source_of,
)


@pytest.mark.parametrize(
    ("peername", "source"),
    [
        (("10.0.0.7", 51000), "10.0.0.7"),
        (("::ffff:10.0.0.7", 51000, 0, 0), "10.0.0.7"),  # IPv4 on a dual-stack socket
        (("fd00::7", 51000, 0, 0), "fd00::7"),
        (("FD00:0::7", 51000, 0, 0), "fd00::7"),  # one spelling per address
        (None, UNKNOWN),
        ((), UNKNOWN),
        (("not an address\x1b[31m", 1), UNKNOWN),
        ("10.0.0.7", UNKNOWN),
    ],
)
def test_the_source_is_the_peers_address_in_one_spelling(peername: object, source: str) -> None:
    assert source_of(peername) == source


def test_an_empty_allow_list_admits_any_source_and_a_list_only_its_networks() -> None:
    nets = parse_networks(("10.0.0.0/24", "fd00:1::/64"))
    assert is_allowed("192.0.2.1", ())
    assert is_allowed(UNKNOWN, ())
    assert is_allowed("10.0.0.7", nets)
    assert is_allowed("fd00:1::9", nets)
    assert not is_allowed("10.0.1.7", nets)
    assert not is_allowed("fd00:2::9", nets)
    assert not is_allowed(UNKNOWN, nets)  # unknown is never taken as allowed


@pytest.mark.parametrize("text", ["10.0.0.1/24", "10.0.0.0/33", "everywhere", "\x1b[2J/8"])
def test_a_network_that_does_not_parse_is_named_clipped(text: str) -> None:
    with pytest.raises(ValueError, match="not a network") as caught:
        parse_networks((text,))
    assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize(("total", "per_source"), [(4, 0), (4, 5), (0, 0)])
def test_caps_must_be_ordered(total: int, per_source: int) -> None:
    with pytest.raises(ValueError, match="max_per_source"):
        Caps(total, per_source)


def test_one_source_holds_at_most_its_cap_and_others_still_get_in() -> None:
    door = Door(Caps(max_connections=10, max_per_source=3), server="peer")
    assert [door.admit("10.0.0.7") for _ in range(5)] == [
        None,
        None,
        None,
        "source-full",
        "source-full",
    ]
    assert door.open == 3
    assert door.open_from("10.0.0.7") == 3
    assert door.admit("10.0.0.8") is None
    door.release("10.0.0.7")
    assert door.admit("10.0.0.7") is None
    assert door.refused == {"source-full": 2}
    assert door.admitted == 5


def test_the_total_cap_holds_across_sources() -> None:
    door = Door(Caps(max_connections=4, max_per_source=2), server="peer")
    verdicts = [door.admit(f"10.0.0.{n}") for n in range(1, 7) for _ in range(2)]
    assert verdicts.count(None) == 4
    assert verdicts[4:] == ["server-full"] * 8
    assert door.open == 4
    door.release("10.0.0.1")
    assert door.admit("10.0.0.6") is None
    assert door.admit("10.0.0.5") == "server-full"


def test_the_allow_list_is_checked_first_and_refuses_without_counting_open() -> None:
    door = Door(Caps(4, 2, parse_networks(("10.0.0.0/24",))), server="peer")
    assert door.admit("192.0.2.1") == "not-allowed"
    assert door.admit(UNKNOWN) == "not-allowed"
    assert door.admit("10.0.0.1") is None
    assert door.open == 1
    assert door.refused == {"not-allowed": 2}


def test_releasing_what_was_never_admitted_is_an_error() -> None:
    door = Door(Caps(4, 2), server="peer")
    with pytest.raises(ValueError, match="no connection"):
        door.release("10.0.0.1")
    door.admit("10.0.0.1")
    door.release("10.0.0.1")
    assert door.open == 0
    with pytest.raises(ValueError, match="no connection"):
        door.release("10.0.0.1")


def test_a_source_refused_is_logged_once_then_counted_when_it_gets_in_again() -> None:
    door = Door(Caps(max_connections=10, max_per_source=1), server="peer")
    with capture_logs() as logs:
        door.admit("10.0.0.7")
        for _ in range(50):
            door.admit("10.0.0.7")
        door.release("10.0.0.7")
        door.admit("10.0.0.7")
        door.admit("10.0.0.7")  # a new episode: logged again
    assert [(e["event"], e.get("refused")) for e in logs] == [
        ("connections_refused", None),
        ("connections_accepted_again", 50),
        ("connections_refused", None),
    ]
    first = logs[0]
    assert first["log_level"] == "warning"
    assert first["address"] == "10.0.0.7"
    assert first["server"] == "peer"
    assert first["open_from_address"] == 1
    assert "too many connections at once from this address" in first["reason"]


def test_the_total_cap_is_logged_once_per_episode_never_per_source() -> None:
    door = Door(Caps(max_connections=2, max_per_source=2), server="peer")
    with capture_logs() as logs:
        door.admit("10.0.0.1")
        door.admit("10.0.0.1")
        for n in range(2, 300):  # many sources: still one line
            door.admit(f"10.0.{n // 256}.{n % 256}")
        door.release("10.0.0.1")
        door.admit("10.0.0.9")
    assert [(e["event"], e.get("refused")) for e in logs] == [
        ("connections_capped", None),
        ("connections_uncapped", 298),
    ]
    assert logs[0]["open"] == 2
    assert logs[0]["max_connections"] == 2


def test_the_sources_remembered_as_refused_are_bounded() -> None:
    door = Door(Caps(1, 1, parse_networks(("10.0.0.0/8",))), server="peer")
    with capture_logs() as logs:
        for n in range(MAX_TRACKED + 10):
            door.admit(str(ipaddress.ip_address("192.0.0.0") + n))
        door.admit("192.0.0.0")  # forgotten since: logged again
    assert len(logs) == MAX_TRACKED + 11
    assert len(door._refusing) == MAX_TRACKED


def test_a_full_server_admits_a_newcomer_when_room_is_made_and_says_so_once() -> None:
    door = Door(Caps(max_connections=2, max_per_source=2), server="peer")
    pushed: list[str] = []

    def room() -> bool:  # what the listener does: close the oldest still in its handshake
        door.release("10.0.0.1")
        pushed.append("10.0.0.1")
        return True

    with capture_logs() as logs:
        door.admit("10.0.0.1")
        door.admit("10.0.0.1")
        assert door.admit("10.0.0.2", room=room) is None
        assert door.admit("10.0.0.3", room=room) is None
        assert door.admit("10.0.0.4", room=lambda: False) == "server-full"
        door.release("10.0.0.2")
        assert door.admit("10.0.0.5", room=room) is None  # room without pushing: the end
    assert pushed == ["10.0.0.1", "10.0.0.1"]
    assert door.open == 2
    assert door.pushed_out == 2
    assert door.refused == {"server-full": 1}
    assert [(e["event"], e.get("refused"), e.get("pushed_out")) for e in logs] == [
        ("connections_capped", None, None),
        ("connections_uncapped", 1, 2),
    ]


def test_room_is_asked_only_when_the_server_is_full() -> None:
    door = Door(Caps(max_connections=4, max_per_source=1), server="peer")
    asked: list[bool] = []

    def room() -> bool:
        asked.append(True)
        return False

    door.admit("10.0.0.1", room=room)
    assert door.admit("10.0.0.1", room=room) == "source-full"
    assert asked == []
