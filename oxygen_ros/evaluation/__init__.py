"""What measures the serving code and serves nothing itself: `bench/` (one robot: the OxyGen settings side by side,
the decode step against its floors, the model's latency, the node's) and `fleet/` (many robots: the fleet simulator
driving the engine's scheduler on its own clock, the simulator-only baselines, robots at 98 % SLO over seeds,
synthetic fleets, hand-off costs, the co-run probe, the robot side of a DDS run). No serving module imports it."""
