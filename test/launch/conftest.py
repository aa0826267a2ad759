"""Files here are launch_testing tests of the installed package (a ROS 2 install with launch and launch_testing).

`colcon test` runs each with `launch_test` (CMakeLists: add_launch_test) and tells the pytest suite to leave them
to it (OXYGEN_ROS_LAUNCH_TESTS_APART). Elsewhere pytest collects them when launch_testing's pytest plugin is
installed (`python -m pytest test/launch/test_vla_node_launch.py` works there) and leaves them out when it is not
(the pip-based development setup, where launch and launch_testing are not installable).
"""

import importlib.util
import os

RUN_APART = bool(os.environ.get("OXYGEN_ROS_LAUNCH_TESTS_APART"))
collect_ignore_glob = ["test_*.py"] if RUN_APART or importlib.util.find_spec("launch_testing") is None else []
