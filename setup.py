"""pip / development install of the oxygen_ros Python package.

`colcon build` uses CMakeLists.txt (ament_cmake: interfaces + this Python package + executables). This file serves
the pip path: `pip install -e .` in the project's virtual environment (see scripts/setup.sh), which installs the
same code with console scripts; the interfaces are built separately by CMake into that environment.
"""

from setuptools import find_packages, setup

NODE_EXECUTABLES = ["vla_node", "replay_node", "record_node", "sim_node", "fleet_node", "scripted_policy", "velocity_watchdog"]

setup(
    packages=find_packages(include=["oxygen_ros", "oxygen_ros.*"]),
    package_data={"oxygen_ros.model": ["cpu_kernel.cpp"],  # compiled on first use (model/cpu_kernel.py)
                  "oxygen_ros.control": ["embodiments/*.yaml"]},  # the shipped embodiment profiles
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/oxygen_ros"]),
        ("share/oxygen_ros", ["package.xml"]),
    ],
    entry_points={
        "console_scripts": ["oxygen-ros = oxygen_ros.commands.cli:main"]
        + [f"{name} = oxygen_ros.nodes.entry:{name}" for name in NODE_EXECUTABLES],
    },
)
