"""Simulation bridge without ROS: the gym-aloha environment wrapper, the action-chunk executor that turns
asynchronously arriving chunks into one command per control step, and episode recording in ALOHA's format.

The simulator itself (gym-aloha, MuJoCo) is the optional `sim` extra and is imported only when an environment is
made, so the executor and recorder work without it.
"""
