"""`make setup CUDA=1` checked as far as a CPU machine can: the pip installs the setup script would run (its
`--print-pip`) take the CUDA build of the pinned torch and the `gpu` extra, and never a CPU build; without CUDA=1,
the CPU build (from the indexes pip has, else PyTorch's CPU index). Without CUDA at all (the other make targets run
setup so), the build a `.venv` already has is kept: tested on a copy of the script beside a `.venv` whose python
imports a stand-in torch that reports the build."""

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPU_TORCH = ("pip install torch==2.13.0+cpu || "
             "pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu")


def pip_lines(cuda: str | None, root: Path = REPO) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA"} | ({"CUDA": cuda} if cuda is not None else {})
    result = subprocess.run(["bash", "scripts/setup.sh", "--print-pip"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def checkout_with_venv(tmp_path: Path, torch_cuda: str | None) -> Path:
    """The setup script in a folder of its own, beside a `.venv` whose python is this interpreter with a stand-in
    torch first on its path: `torch.version.cuda` is `torch_cuda` (None: the CPU build)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    fake = tmp_path / "fake_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"__version__ = '2.13.0'\n\n\nclass version:\n    cuda = {torch_cuda!r}\n")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake.parent} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return root


def test_cuda_setup_installs_the_cuda_torch_and_the_gpu_extra():
    torch_line, ros_line, package_line, client_line = pip_lines("1")
    # `===`: exactly 2.13.0, which a `+cpu` local build never matches; PyPI's Linux wheel is the CUDA build.
    assert torch_line == "pip install torch===2.13.0"
    assert "cpu" not in torch_line and "--index-url" not in torch_line and "--extra-index-url" not in torch_line
    assert ros_line == "pip install -r scripts/requirements-ros.txt"
    assert package_line.endswith("-e .[test,sim,ray,gpu]")
    assert client_line == "pip install --no-deps openpi-client==0.1.2"  # its numpy<2 pin must not apply
    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    gpu = {re.split(r"[<>=!~;\[ ]", line)[0] for line in extras["options.extras_require"]["gpu"].split()}
    assert {"cuda-bindings", "nvidia-ml-py"} <= gpu
    assert "torch" not in gpu  # nothing in the extra can swap the torch build


def test_default_setup_installs_the_cpu_build(tmp_path):
    fresh = tmp_path / "fresh"  # no .venv yet: the CPU build
    (fresh / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", fresh / "scripts" / "setup.sh")
    for cuda in (None, "0", ""):
        torch_line, _, package_line, _ = pip_lines(cuda, fresh)
        # the CPU build from the indexes pip is set up with, else from PyTorch's CPU index
        assert torch_line == CPU_TORCH
        assert package_line.endswith("-e .[test,sim,ray]")


def test_setup_without_cuda_keeps_the_venvs_cuda_build(tmp_path):
    """`make demo` and the other targets run setup without CUDA: on a `make setup CUDA=1` machine they keep the CUDA
    torch; only an explicit CUDA=0 goes back to the CPU build."""
    root = checkout_with_venv(tmp_path, "13.0")
    torch_line, _, package_line, _ = pip_lines(None, root)
    assert torch_line == "pip install torch===2.13.0"
    assert package_line.endswith("-e .[test,sim,ray,gpu]")
    torch_line, _, package_line, _ = pip_lines("0", root)
    assert torch_line == CPU_TORCH
    assert package_line.endswith("-e .[test,sim,ray]")


def test_setup_without_cuda_keeps_the_venvs_cpu_build(tmp_path):
    root = checkout_with_venv(tmp_path, None)
    assert pip_lines(None, root)[0] == CPU_TORCH
    assert pip_lines("1", root)[0] == "pip install torch===2.13.0"  # CUDA=1 still switches
