"""`colcon build` of this ament_cmake package in a fresh workspace: interfaces, Python package and executables.

The development setup installs the Python code with pip; this proves the ROS-workspace path a ROS user takes.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = ["CMakeLists.txt", "package.xml", "setup.py", "setup.cfg", "msg", "oxygen_ros", "launch",
                 "config", "resource", "cmake"]


def test_colcon_build_installs_interfaces_python_and_executables(tmp_path):
    source = tmp_path / "src" / "oxygen_ros"
    source.mkdir(parents=True)
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    prefix = Path(sys.prefix)
    env = dict(os.environ, PATH=f"{prefix / 'bin'}:{os.environ['PATH']}", AMENT_PREFIX_PATH=str(prefix))
    build = subprocess.run(
        [str(prefix / "bin" / "colcon"), "build", "--event-handlers", "console_direct-", "--cmake-args",
         f"-DPython3_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF",
         f"-DCMAKE_PROJECT_INCLUDE={source / 'cmake' / 'drop_missing_include_dirs.cmake'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]

    install = tmp_path / "install" / "oxygen_ros"
    declared = re.search(r"set\(OXYGEN_ROS_NODE_EXECUTABLES ([^)]*)\)", (ROOT / "CMakeLists.txt").read_text())
    executables = declared.group(1).split()
    assert "vla_node" in executables
    for executable in executables:
        assert os.access(install / "lib" / "oxygen_ros" / executable, os.X_OK)
    assert (install / "share" / "oxygen_ros" / "package.xml").exists()
    assert (install / "share" / "oxygen_ros" / "msg" / "Narration.msg").exists()
    for folder in ("launch", "config"):
        assert (install / "share" / "oxygen_ros" / folder).is_dir()

    # The installed package (not this checkout) provides both the Python code and the generated messages.
    check = ("import oxygen_ros, oxygen_ros.msg as m; "
             "print(oxygen_ros.__file__); print(m.Narration(text='hi').text)")
    shell = f"source {tmp_path / 'install' / 'setup.bash'} && cd {tmp_path} && {sys.executable} -c \"{check}\""
    env.pop("PYTHONPATH", None)
    result = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    installed_init, text = result.stdout.split()
    assert installed_init.startswith(str(install)) and text == "hi"
