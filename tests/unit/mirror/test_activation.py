"""Socket activation of the node mirror, the pure part (decision 0063): what
``LISTEN_PID``/``LISTEN_FDS`` say, and whether a passed socket is ``[mirror] listen``."""

from __future__ import annotations

import pytest

from nodeagent.config.addresses import Address
from nodeagent.mirror.activation import Passed, SocketFacts, passed_fds, socket_problem

PID = 4242
WANTED = Address("127.0.0.1", 22626)


def test_nothing_passed_without_the_variables() -> None:
    assert passed_fds({}, PID) == Passed(0)


def test_one_socket_passed_to_this_process() -> None:
    assert passed_fds({"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}, PID) == Passed(1)


def test_variables_meant_for_another_process_pass_nothing() -> None:
    """Inherited from a parent that was socket-activated: not ours (sd_listen_fds(3))."""
    assert passed_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}, PID) == Passed(0)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"LISTEN_FDS": "1"}, "LISTEN_PID is not a process id"),
        ({"LISTEN_PID": "-1", "LISTEN_FDS": "1"}, "LISTEN_PID is not a process id"),
        ({"LISTEN_PID": "4242x", "LISTEN_FDS": "1"}, "LISTEN_PID is not a process id"),
        ({"LISTEN_PID": "٤٢٤٢", "LISTEN_FDS": "1"}, "LISTEN_PID is not a process id"),
        ({"LISTEN_PID": "9" * 40, "LISTEN_FDS": "1"}, "LISTEN_PID is not a process id"),
        ({"LISTEN_PID": str(PID)}, "LISTEN_FDS is not a count of descriptors"),
        ({"LISTEN_PID": str(PID), "LISTEN_FDS": "one"}, "LISTEN_FDS is not a count of descriptors"),
        ({"LISTEN_PID": str(PID), "LISTEN_FDS": "65"}, "LISTEN_FDS is not a count of descriptors"),
    ],
)
def test_malformed_variables_are_a_problem_never_a_guess(env: dict[str, str], problem: str) -> None:
    assert passed_fds(env, PID) == Passed(0, problem)


@pytest.mark.parametrize("count", [0, 2, 64])
def test_the_mirror_takes_exactly_one_socket(count: int) -> None:
    passed = passed_fds({"LISTEN_PID": str(PID), "LISTEN_FDS": str(count)}, PID)
    assert passed.count == count
    assert passed.problem == f"{count} sockets were passed; the node mirror takes exactly one"


def facts(**changes: object) -> SocketFacts:
    fields: dict[str, object] = {
        "is_inet": True, "is_stream": True, "is_listening": True,
        "host": "127.0.0.1", "port": 22626,
    }  # fmt: skip
    fields.update(changes)
    return SocketFacts(**fields)  # type: ignore[arg-type]


def test_a_listening_tcp_socket_on_exactly_the_address_is_taken() -> None:
    assert socket_problem(facts(), WANTED) == ""


def test_an_ipv4_mapped_address_is_the_same_address() -> None:
    assert socket_problem(facts(host="::ffff:127.0.0.1"), WANTED) == ""


def test_ipv6_loopback_in_brackets() -> None:
    assert socket_problem(facts(host="::1"), Address("::1", 22626)) == ""


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"is_inet": False}, "the socket passed is not a TCP socket"),
        ({"is_stream": False}, "the socket passed is not a TCP socket"),
        ({"is_listening": False}, "the socket passed is not listening"),
        ({"port": 22627}, "listens on 127.0.0.1:22627, [mirror] listen is 127.0.0.1:22626"),
        ({"host": "0.0.0.0"}, "listens on 0.0.0.0:22626, [mirror] listen is 127.0.0.1:22626"),  # noqa: S104
        ({"host": "127.0.0.2"}, "listens on 127.0.0.2:22626, [mirror] listen is 127.0.0.1:22626"),
        ({"host": "::"}, "listens on [::]:22626, [mirror] listen is 127.0.0.1:22626"),
        ({"host": ""}, "listens on :22626, [mirror] listen is 127.0.0.1:22626"),
    ],
)
def test_any_other_socket_is_refused_with_what_it_is(
    changes: dict[str, object], problem: str
) -> None:
    assert problem in socket_problem(facts(**changes), WANTED)
