"""The fleet's evaluation: `simulator` (the engine's scheduler and the fleet's planners on a simulated clock),
`baselines` (the stage-process and inter-GPU designs, simulated only), `capacity` (robots at 98 % SLO by bisection
over seeds; SLO-safe loads for placement), `fleets` (synthetic fleets), `ipc` (measured hand-off costs),
`co_run_probe` (why co-running stages are slower on a CPU), `robot_load` (a robot's side of a DDS run)."""
