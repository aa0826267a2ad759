"""Control-side logic without ROS: the hand-over between successive action chunks on the control timeline
(`chunk_executor`, `handover`) and the split of a plan into per-controller joint groups in robot units
(`joint_groups`). Used by the VLA node (plans for trajectory controllers) and the simulator bridge (one command
per step).
"""
