"""Files here are launch_testing tests: `colcon test` runs them with `launch_test` (CMakeLists: add_launch_test).

They need launch, launch_ros and launch_testing from a ROS 2 install, so a plain pytest run of test/ leaves them
to that runner instead of importing them as pytest modules.
"""

collect_ignore_glob = ["*.launch.py"]
