"""The fleet controller's Prometheus metrics, scraped over HTTP from the real prometheus-client server and read
back with its own parser (the controller's own run over DDS is scraped in test_fleet_controller_dds.py)."""

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oxygen_ros.fleet.metrics import serve_metrics

STATUS = {
    "version": 7, "ready": True,
    "robots": {
        "r1": {"server": "gpu0", "model_id": "a", "rate_hz": 5.0, "slo_s": 0.2, "state": "placed", "reason": "",
               "attainment": 0.97, "served": True},
        "r2": {"server": None, "model_id": "b", "rate_hz": 5.0, "slo_s": 0.2, "state": "waiting",
               "reason": "server gpu1 is down", "attainment": None, "served": False},
    },
    "servers": {
        "gpu0": {"alive": True, "planned_load": 0.4, "measured_load": 0.35, "robots": ["r1"], "models": ["a"],
                 "applied_version": 7, "heartbeat_age_s": 0.2},
        "gpu1": {"alive": False, "planned_load": 0.0, "measured_load": None, "robots": [], "models": [],
                 "applied_version": None, "heartbeat_age_s": None},
    },
    "refused": {"r9": "does not fit"}, "replans": 3, "moved": [], "bad_requests": 2, "bad_heartbeats": 1,
}


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; a process started next binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_status_is_served_as_metrics_and_each_scrape_reads_the_latest():
    latest = {"status": None}
    server = serve_metrics(0, lambda: latest["status"], addr="127.0.0.1")
    try:
        assert not any(name.startswith("oxygen_fleet_") for name, _ in scrape(server.server_port))  # none yet
        latest["status"] = STATUS
        samples = scrape(server.server_port)
        assert samples[("oxygen_fleet_ready", ())] == 1
        assert samples[("oxygen_fleet_assignment_version", ())] == 7
        assert samples[("oxygen_fleet_robots", (("state", "placed"),))] == 1
        assert samples[("oxygen_fleet_robots", (("state", "waiting"),))] == 1
        assert samples[("oxygen_fleet_refused_robots", ())] == 1
        assert samples[("oxygen_fleet_server_alive", (("server", "gpu0"),))] == 1
        assert samples[("oxygen_fleet_server_alive", (("server", "gpu1"),))] == 0
        assert samples[("oxygen_fleet_server_planned_load", (("server", "gpu0"),))] == pytest.approx(0.4)
        assert samples[("oxygen_fleet_server_measured_load", (("server", "gpu0"),))] == pytest.approx(0.35)
        assert ("oxygen_fleet_server_measured_load", (("server", "gpu1"),)) not in samples  # no figure: no sample
        assert ("oxygen_fleet_server_heartbeat_age_seconds", (("server", "gpu1"),)) not in samples
        assert samples[("oxygen_fleet_server_robots", (("server", "gpu0"),))] == 1
        assert samples[("oxygen_fleet_robot_attainment",
                        (("model", "a"), ("robot", "r1"), ("server", "gpu0")))] == pytest.approx(0.97)
        assert not [key for key in samples if key[0] == "oxygen_fleet_robot_attainment" and ("robot", "r2") in key[1]]
        assert samples[("oxygen_fleet_replans_total", ())] == 3
        assert samples[("oxygen_fleet_bad_requests_total", ())] == 2
        assert samples[("oxygen_fleet_bad_heartbeats_total", ())] == 1

        latest["status"] = {**STATUS, "version": 8, "replans": 4}
        samples = scrape(server.server_port)
        assert samples[("oxygen_fleet_assignment_version", ())] == 8
        assert samples[("oxygen_fleet_replans_total", ())] == 4
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_in_use_is_an_os_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            serve_metrics(taken.getsockname()[1], lambda: None, addr="127.0.0.1")


@pytest.mark.parametrize("case", ["out of range", "in use"])
def test_the_controller_refuses_a_metrics_port_it_cannot_serve_in_one_line(case, ros_domain_id, monkeypatch,
                                                                          capfd):
    from oxygen_ros.nodes.fleet_controller import main

    monkeypatch.setenv("ROS_DOMAIN_ID", str(ros_domain_id))
    lut = Path(__file__).parents[1] / "fixtures" / "fleet_cpu_lut.json"
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = 70000 if case == "out of range" else taken.getsockname()[1]
        assert main(["--ros-args", "-p", f"profile_file:={lut}", "-p", "models:=['a']", "-p", "load_seeds:=1",
                     "-p", "load_duration_s:=0.5", "-p", f"metrics_port:={port}"]) == 1
    err = capfd.readouterr().err
    expected = "metrics_port must be 0 (none) or a port, got 70000" if case == "out of range" else "Address"
    assert err.startswith("error: ") and expected in err and "Traceback" not in err, err
