"""What measures the serving code and serves nothing itself: `bench/` (one robot: the OxyGen settings side by side,
the decode step against its floors, the model's latency, the node's) and `fleet/` (many robots: synthetic
fleets, hand-off costs, the co-run probe, the robot side of a DDS run; the fleet simulator the controller plans with
is `oxygen_ros.fleet.simulator`). No serving module imports it."""
