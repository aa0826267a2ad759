"""A demo's isolated DDS domain is one no test run holds: domain_coordinator's reservation (what launch_testing
and these tests take before their first participant exists) is honoured, and the demo's domain is reserved so in
turn while its process lives."""

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
    with domain_id() as free:
        pass  # a domain nobody holds (released again)
    others = iter([d for d in range(1, 101) if d != free])
    with domain_id(selector=lambda: next(others)) as held:  # held by "a test run" from here on
        monkeypatch.setattr(processes.random, "sample", lambda population, k: [held, free])
        assert processes.free_domain_id() == free
        assert not bindable(free)  # reserved by this process now, as domain_coordinator would
    taken = len(processes._reservations)
    monkeypatch.setattr(processes.random, "sample", lambda population, k: [free])
    try:
        processes.free_domain_id()
    except RuntimeError as err:  # the only candidate is this process's own: no free domain left
        assert "no free ROS_DOMAIN_ID in 1..100" in str(err)
    else:
        raise AssertionError("a domain already reserved was handed out twice")
    assert len(processes._reservations) == taken
