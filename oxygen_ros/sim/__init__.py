"""Simulation bridge without ROS: the gym-aloha environment wrapper and episode recording in ALOHA's format (the
chunk executor that turns asynchronously arriving chunks into one command per step is `oxygen_ros.control`'s).

The simulator itself (gym-aloha, MuJoCo) is the optional `sim` extra and is imported only when an environment is
made, so the recorder works without it.
"""
