"""A demo's isolated DDS domain is one no test run holds: domain_coordinator's reservation (what launch_testing
and these tests take before their first participant exists) is honoured, and the demo's domain is reserved so in
turn while its process lives."""

import contextlib
import socket

from domain_coordinator import domain_id

from oxygen_ros.commands import processes


def bindable(domain: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", processes.COORDINATOR_PORT_BASE + domain))
        except OSError:
            return False
    return True


def test_a_domain_a_test_run_holds_is_skipped_and_the_chosen_one_is_held(monkeypatch):
    with contextlib.ExitStack() as stack:  # four domains nobody holds (released again: a test beside may take one)
        frees = [stack.enter_context(domain_id()) for _ in range(4)]
    others = iter([d for d in range(1, 101) if d not in frees])
    with domain_id(selector=lambda: next(others)) as held:  # held by "a test run" from here on
        monkeypatch.setattr(processes.random, "sample", lambda population, k: [held, *frees])
        chosen = processes.free_domain_id()
        assert chosen in frees  # the held one skipped, the first of the others still free taken
        assert not bindable(chosen)  # reserved by this process now, as domain_coordinator would
    taken = len(processes._reservations)
    monkeypatch.setattr(processes.random, "sample", lambda population, k: [chosen])
    try:
        processes.free_domain_id()
    except RuntimeError as err:  # the only candidate is this process's own: no free domain left
        assert "no free ROS_DOMAIN_ID in 1..100" in str(err)
    else:
        raise AssertionError("a domain already reserved was handed out twice")
    assert len(processes._reservations) == taken
