"""The fleet controller's status as Prometheus metrics, served over HTTP the way serving stacks export theirs.

`StatusMetrics` reads the latest status document the controller published (`FleetController.status()`: a plain
dict, replaced whole on each publish, so a scrape from the HTTP server's thread never sees one half-built) and
turns it into metric families at scrape time; `serve_metrics` starts the HTTP server on a port of its own registry.
Names (all prefixed ``oxygen_fleet_``; a robot's and a server's labels are their ids):

- ``ready`` (1 once the placement is recovered), ``assignment_version``, ``robots{state}`` (placed, waiting),
  ``refused_robots`` (the latest refusals kept in the status);
- per server: ``server_alive``, ``server_planned_load``, ``server_measured_load`` (absent until its heartbeat
  reports one), ``server_robots``, ``server_heartbeat_age_seconds``;
- per robot with a reported figure: ``robot_attainment{robot,server,model}``;
- counters: ``replans_total``, ``bad_requests_total``, ``bad_heartbeats_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "oxygen_fleet_"


class StatusMetrics:
    """A Prometheus collector over the controller's status document (`latest()` returns it, or None before the
    first one)."""

    def __init__(self, latest: Callable[[], dict | None]):
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        status = self.latest()
        if status is None:
            return
        yield _gauge("ready", "1 once the controller has recovered the placement", float(status["ready"]))
        yield _gauge("assignment_version", "the version of the latest assignment", status["version"])
        robots = status["robots"].values()
        by_state = GaugeMetricFamily(PREFIX + "robots", "robots the controller knows, by state", labels=["state"])
        for state in ("placed", "waiting"):
            by_state.add_metric([state], sum(robot["state"] == state for robot in robots))
        yield by_state
        yield _gauge("refused_robots", "robots whose latest join was refused (the status keeps the latest)",
                     len(status["refused"]))

        servers = status["servers"]
        per_server = {
            "server_alive": ("1 while the server's heartbeat is current", lambda s: float(s["alive"])),
            "server_planned_load": ("the share of the server the placement gives its robots",
                                    lambda s: s["planned_load"]),
            "server_measured_load": ("the load the server's heartbeat reports", lambda s: s["measured_load"]),
            "server_robots": ("robots placed on the server", lambda s: len(s["robots"])),
            "server_heartbeat_age_seconds": ("seconds since the server's latest heartbeat",
                                             lambda s: s["heartbeat_age_s"]),
        }
        for name, (text, value) in per_server.items():
            family = GaugeMetricFamily(PREFIX + name, text, labels=["server"])
            for server, entry in sorted(servers.items()):
                if (figure := value(entry)) is not None:
                    family.add_metric([server], figure)
            yield family

        attainment = GaugeMetricFamily(PREFIX + "robot_attainment",
                                       "the robot's SLO attainment as its server reports it",
                                       labels=["robot", "server", "model"])
        for robot_id, robot in sorted(status["robots"].items()):
            if robot["attainment"] is not None:
                attainment.add_metric([robot_id, robot["server"] or "", robot["model_id"]], robot["attainment"])
        yield attainment

        for name, text in (("replans", "re-plans of the placement"),
                           ("bad_requests", "join or leave requests that could not be read"),
                           ("bad_heartbeats", "heartbeats dropped as unreadable or unknown")):
            yield CounterMetricFamily(PREFIX + name, text, value=status[name])


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, value=value)


def serve_metrics(port: int, latest: Callable[[], dict | None], addr: str = "0.0.0.0"):
    """Serve the metrics on `port` (0: a free one) in a daemon thread. Returns the HTTP server (its
    `server_port` is the port bound; `shutdown()` stops it). OSError when the port cannot be bound."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusMetrics(latest))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
