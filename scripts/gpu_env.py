"""Is this interpreter fit for the GPU checks? One line a check; status 0 or 1, never a traceback.

    python scripts/gpu_env.py            every package the checks import is there (all that is missing said in
                                         one line, with the names pip knows them by), then torch is a CUDA build
                                         and sees a device (what `gpu_python.sh` asks of each interpreter it tries)
    python scripts/gpu_env.py --driver   that, and the `gpu` extra works on this driver: NVML's energy counter
                                         (nvidia-ml-py; missing only costs the energy figures) and green-context
                                         SM partitions through cuda-bindings (the project's own SmPartitions);
                                         status 1 without partitions, after the lines it could say

Needs nothing but the interpreter: no install of this package (it is imported from the checkout), no virtual
environment, no ROS, so a GPU machine's own `python3` can be checked before anything runs on it.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, whatever the cwd

# what the checks import (test_gpu, the benchmarks, the fleet profile, the energy counter, the SM partitions):
# module -> the package pip installs it from
NEEDED = {
    "torch": "torch", "numpy": "numpy", "yaml": "pyyaml", "safetensors": "safetensors",
    "sentencepiece": "sentencepiece", "huggingface_hub": "huggingface_hub", "PIL": "pillow", "tqdm": "tqdm",
    "matplotlib": "matplotlib", "msgpack": "msgpack", "pytest": "pytest", "pynvml": "nvidia-ml-py",
    "cuda.bindings.driver": "cuda-bindings",
}
# the modules the steps run, imported once the packages above are found: whatever else they need is said too
STEP_MODULES = ("oxygen_ros.evaluation.bench.oxygen_bench", "oxygen_ros.commands.fleet_profile",
                "oxygen_ros.commands.fleet_bench",
                "oxygen_ros.fleet.server", "oxygen_ros.fleet.sm_partition", "oxygen_ros.evaluation.bench.energy")


def found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a missing parent package (cuda of cuda.bindings)
        return False


def imports() -> None:
    missing = [f"{package} ({module})" for module, package in NEEDED.items() if not found(module)]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}")
    for module in STEP_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            raise SystemExit(f"missing {error.name} (imported by {module})") from None


def device() -> str:
    try:
        import torch
    except ImportError as error:
        raise SystemExit(f"no torch ({error})") from None
    if torch.version.cuda is None:
        raise SystemExit(f"torch {torch.__version__} is a CPU build")
    if not torch.cuda.is_available():
        raise SystemExit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
    p = torch.cuda.get_device_properties(0)
    return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, {p.name}, compute capability "
            f"{p.major}.{p.minor}, {p.multi_processor_count} SMs")


def energy() -> str:
    from oxygen_ros.evaluation.bench.energy import cuda_uuid, open_energy_meter

    return open_energy_meter("cuda:0", uuid=cuda_uuid("cuda:0"))[1]


def sm_partitions() -> str:
    from oxygen_ros.fleet.sm_partition import SmPartitions

    try:
        partitions = SmPartitions("cuda:0")
        shares = partitions.shares()
    except ImportError as error:
        raise SystemExit(f"no cuda-bindings ({error}): install the gpu extra, pip install -e '.[gpu]'") from None
    except (RuntimeError, ValueError) as error:
        raise SystemExit(f"green contexts unavailable: {error}") from None
    from importlib.metadata import version

    groups = {s: partitions.group_sizes(s)[0] for s in shares[:-1]}
    return (f"green contexts: cuda-bindings {version('cuda-bindings')}, {partitions.total_sms} SMs, groups asked "
            f"in {partitions.granularity}, shares and the SMs the driver makes for them: {groups}")


def main(argv: list[str]) -> int:
    # each line as soon as it is known: a failed check below still leaves the device's line (and NVML's) said
    if "--driver" not in argv:
        imports()
    print(device(), flush=True)
    if "--driver" in argv:
        print(energy(), flush=True)
        print(sm_partitions())
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except Exception as error:  # noqa: BLE001 - one line, never a traceback
        raise SystemExit(f"{type(error).__name__}: {error}") from None
