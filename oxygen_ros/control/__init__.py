"""Control-side logic without ROS: embodiment profiles, what a checkpoint's state and action dims mean on a robot
(`embodiment`), the hand-over between successive action chunks on the control timeline (`chunk_executor`,
`handover`) and the split of a plan into per-controller joint groups in controller units (`joint_groups`). Used by the VLA node (plans for trajectory controllers) and the simulator bridge (one command
per step).
"""
