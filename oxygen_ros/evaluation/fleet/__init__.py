"""The fleet's evaluation: `fleets` (synthetic fleets), `ipc` (measured hand-off costs), `co_run_probe` (why
co-running stages are slower on a CPU), `robot_load` (a robot's side of a DDS run). The simulator, its baselines and
the capacity search live in `oxygen_ros.fleet` (`fleet-assign` plans with them)."""
