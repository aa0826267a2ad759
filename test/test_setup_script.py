"""`make setup CUDA=1` checked as far as a CPU machine can: the pip installs the setup script would run (its
`--print-pip`) take the CUDA build of the pinned torch and the `gpu` extra, and never a CPU build; without CUDA=1,
the CPU build (from the indexes pip has, else PyTorch's CPU index)."""

import configparser
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pip_lines(cuda: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA"} | ({"CUDA": cuda} if cuda is not None else {})
    result = subprocess.run(["bash", "scripts/setup.sh", "--print-pip"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_cuda_setup_installs_the_cuda_torch_and_the_gpu_extra():
    torch_line, ros_line, package_line, client_line = pip_lines("1")
    # `===`: exactly 2.13.0, which a `+cpu` local build never matches; PyPI's Linux wheel is the CUDA build.
    assert torch_line == "pip install torch===2.13.0"
    assert "cpu" not in torch_line and "--index-url" not in torch_line and "--extra-index-url" not in torch_line
    assert ros_line == "pip install -r scripts/requirements-ros.txt"
    assert package_line.endswith("-e .[test,sim,gpu]")
    assert client_line == "pip install --no-deps openpi-client==0.1.2"  # its numpy<2 pin must not apply
    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    gpu = {re.split(r"[<>=!~;\[ ]", line)[0] for line in extras["options.extras_require"]["gpu"].split()}
    assert {"cuda-bindings", "nvidia-ml-py"} <= gpu
    assert "torch" not in gpu  # nothing in the extra can swap the torch build


def test_default_setup_installs_the_cpu_build():
    for cuda in (None, "0", ""):
        torch_line, _, package_line, _ = pip_lines(cuda)
        # the CPU build from the indexes pip is set up with, else from PyTorch's CPU index
        assert torch_line == ("pip install torch==2.13.0+cpu || "
                              "pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu")
        assert package_line.endswith("-e .[test,sim]")
