"""Robion-style fleet serving: many robots, several VLA models, one or more GPUs, per-robot latency SLOs.

``server`` (the fleet server a ``fleet_node`` runs: the engine's runtime for many robots), ``designs`` (how a device
runs frames: the engine's monolithic planner, the ``lockstep`` and the ``static_split``, planners of the engine's
scheduler over ``two_stage`` queues), ``profile_table`` (stage latencies, and the cost model from them),
``profiler`` (timing the served runners), ``specs`` (model specs and served robots as plain values), ``models`` and
``device`` (what a server loads, and where; ``sm_partition`` for the GPU's shares), ``traffic`` (robots -> GPUs),
``simulator`` (the scheduler and the designs on a simulated clock, with the simulator-only ``baselines``),
``capacity`` (robots at the target over seeds, the SLO-safe loads) and ``placement`` (the live placement's
decisions, which the Ray pool's controller runs). Nothing here imports rclpy; the planning modules import no torch.
"""
