"""Robion-style fleet serving: many robots, several VLA models, one or more GPUs, per-robot latency SLOs.

Modules, one job each: ``requests`` (requests, robots, per-model stage queues), ``policies`` (which queue a free
stage serves), ``batching`` (power-of-two batches cut at stage start), ``profile_table`` (the latency LUT and the
profiler that fills it), ``device`` (what all device schedulers share, and real execution of their work),
``lockstep`` (the Robion device scheduler), ``baselines`` (monolithic and static-split devices), ``traffic``
(robots -> GPUs, and its online controller), ``workload`` (synthetic fleets), ``simulator`` (discrete-event fleet
simulation), ``capacity`` (robots at 98 % SLO over seeds, SLO-safe loads), ``server`` (the serving facade the
fleet node runs), ``fleet_sim_cli`` (the ``fleet-sim`` command). Nothing here imports rclpy.
"""
