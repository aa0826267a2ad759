"""Robion-style fleet serving: many robots, several VLA models, one or more GPUs, per-robot latency SLOs.

Serving: ``server`` (the fleet server a ``fleet_node`` runs: the engine's runtime for many robots), ``designs``
(how a device runs frames: the monolithic planner, the ``lockstep`` and the ``static_split``, all planners of the
engine's scheduler over ``two_stage`` queues), ``profile_table`` (stage latencies, and the cost model from them),
``profiler`` (timing the served runners), ``models`` and ``device`` (what a server loads, and where), ``traffic``
(robots -> GPUs). Evaluation: ``simulator`` (the same scheduler and planners on a simulated clock), ``omni`` (its
baselines), ``capacity`` and ``workload`` (robots at 98 % SLO over seeds), the probes and the commands. Nothing
here imports rclpy.
"""
