"""Robion-style fleet serving: many robots, several VLA models, one or more GPUs, per-robot latency SLOs.

``server`` (the fleet server a ``fleet_node`` runs: the engine's runtime for many robots), ``designs`` (how a device
runs frames: the engine's monolithic planner, the ``lockstep`` and the ``static_split``, planners of the engine's
scheduler over ``two_stage`` queues), ``profile_table`` (stage latencies, and the cost model from them),
``profiler`` (timing the served runners), ``models`` and ``device`` (what a server loads, and where; ``sm_partition``
for the GPU's shares), ``traffic`` (robots -> GPUs). Its evaluation (the simulator and baselines):
``oxygen_ros/evaluation/fleet``. Nothing here imports rclpy.
"""
