"""The README's workspace build with the ROS 2 wheels, run line by line as written, then `colcon test`.

The README block marked `workspace-build-wheels` is run by bash in a fresh HOME with this environment activated; its
`git clone <this repository>` clones a git repository made from this checkout's package files. Then: the installed
executables and share files exist, the installed package (not this checkout) imports with its generated messages,
and `colcon test` runs registered tests (a small selection through PYTEST_ADDOPTS, as the README shows).
"""

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = ["CMakeLists.txt", "package.xml", "setup.py", "setup.cfg", "msg", "oxygen_ros", "launch",
                 "config", "resource", "cmake", "test", "scripts", "docs"]  # the tests read docs/ too
MARKER = "<!-- workspace-build-wheels"

pytestmark = pytest.mark.system


def readme_build_lines() -> str:
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    return block.group(1)


def make_repository(path: Path) -> None:
    path.mkdir(parents=True)
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, path / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "package"]):
        subprocess.run(git + args, cwd=path, check=True, capture_output=True)


def run_bash(script: str, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=timeout)


def test_readme_workspace_build_runs_as_written_and_colcon_test_runs_tests(tmp_path):
    lines = readme_build_lines()
    assert "AMENT_PREFIX_PATH" in lines and "colcon build" in lines and "source install/setup.bash" in lines
    assert "<this repository>" in lines
    repository = tmp_path / "repository"
    make_repository(repository)
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AMENT_", "COLCON_", "CMAKE_", "PYTEST_")) and key not in ("PYTHONPATH",
                                                                                          "VIRTUAL_ENV")}
    env["HOME"] = str(home)
    activate = f"source {Path(sys.prefix) / 'bin' / 'activate'}\n"
    build = run_bash(activate + lines.replace("<this repository>", str(repository)), env, timeout=600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    # The last README line: the installed command's version and a generated message.
    assert build.stdout.split()[-3:] == ["oxygen-ros", "0.1.0", "ok"], build.stdout[-2000:]

    workspace = home / "ws"
    install = workspace / "install" / "oxygen_ros"
    # CMake skips installing a file whose installed copy's time is within a second of the source's. When the build
    # follows the checkout within a second, rosidl's empty __init__.py (installed first) and ours have such times:
    # made so here, ours must still be installed over rosidl's.
    site = next((install / "lib").glob("python3*/site-packages/oxygen_ros"))
    source_init = workspace / "src" / "oxygen_ros" / "oxygen_ros" / "__init__.py"
    generated = workspace / "build" / "oxygen_ros" / "rosidl_generator_py" / "oxygen_ros" / "__init__.py"
    times = (generated.stat().st_atime_ns, generated.stat().st_mtime_ns)
    (site / "__init__.py").write_text(generated.read_text())
    for path in (source_init, site / "__init__.py"):
        os.utime(path, ns=times)
    again = run_bash(activate + f"export AMENT_PREFIX_PATH=$VIRTUAL_ENV && cd {workspace} && colcon build "
                     "--packages-select oxygen_ros --cmake-args "
                     "-DCMAKE_PROJECT_INCLUDE=$PWD/src/oxygen_ros/cmake/drop_missing_include_dirs.cmake", env,
                     timeout=600)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert (site / "__init__.py").read_text() == source_init.read_text()
    declared = re.search(r"set\(OXYGEN_ROS_NODE_EXECUTABLES ([^)]*)\)", (ROOT / "CMakeLists.txt").read_text())
    executables = declared.group(1).split()
    assert "vla_node" in executables
    for executable in executables:
        assert os.access(install / "lib" / "oxygen_ros" / executable, os.X_OK)
    share = install / "share" / "oxygen_ros"
    assert (share / "package.xml").exists() and (share / "msg" / "Narration.msg").exists()
    for folder in ("launch", "config"):
        assert (share / folder).is_dir()

    # After `source install/setup.bash` the installed package (not this checkout) provides code and messages, and
    # an installed node executable starts (a bad parameter makes it exit with its one-line start-up error).
    setup = f"{activate}cd {workspace} && source install/setup.bash && cd {tmp_path}\n"
    check = ("import oxygen_ros, oxygen_ros.msg as m; "
             "print(oxygen_ros.__file__); print(m.Narration(text='hi').text)")
    result = run_bash(setup + f"python -c \"{check}\"", env, timeout=120)
    assert result.returncode == 0, result.stderr
    installed_init, text = result.stdout.split()
    assert installed_init.startswith(str(install)) and text == "hi"
    node = run_bash(setup + f"ROS_LOG_DIR=$PWD/log {install / 'lib' / 'oxygen_ros' / 'vla_node'} --ros-args "
                    f"--params-file {share / 'config' / 'aloha.yaml'} -p model.preset:=no_such_preset -p autostart:=true "
                    "|| echo exit=$?", env, timeout=180)
    assert "exit=1" in node.stdout, node.stdout[-2000:] + node.stderr[-2000:]
    assert "no_such_preset" in node.stdout + node.stderr

    # `colcon test`: the registered pytest suite, narrowed to one quick file, reports its tests.
    test = run_bash(setup + f"cd {workspace} && PYTEST_ADDOPTS='-k test_interfaces' colcon test "
                    "--packages-select oxygen_ros --event-handlers console_direct- && colcon test-result --all",
                    env, timeout=600)
    assert test.returncode == 0, test.stdout[-4000:] + test.stderr[-4000:]
    xunit = workspace / "build" / "oxygen_ros" / "test_results" / "oxygen_ros" / "pytest.xunit.xml"
    suite = ET.parse(xunit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) > 0
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
