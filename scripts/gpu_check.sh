#!/usr/bin/env bash
# The GPU checks and figures in one run (about 15 minutes on one recent GPU): the CUDA test suite, the OxyGen
# benchmark on `small` and `pi05` (bf16), and a green-context fleet profile (with and without CUDA graphs). Needs
# python3 with a CUDA build of torch, numpy, scipy, matplotlib, sentencepiece, pyyaml, (for SM partitions)
# cuda-bindings and (for the benchmark's energy figures) nvidia-ml-py; no ROS.
# Usage: bash scripts/gpu_check.sh [OUT_DIR [STEP ...]]   (default out/gpu, every step: test_gpu bench_small
# bench_small_graphs bench_goals fleet_profile fleet_profile_graphs bench_pi05). Each step has its own time limit
# and the run goes on after a failed step, so one slow step does not lose the others' results; the exit status is
# the number of failed steps.
set -u
cd "$(dirname "$0")/.."
out=${1:-out/gpu}
shift || true
steps=" ${*:-test_gpu bench_small bench_small_graphs bench_goals fleet_profile fleet_profile_graphs bench_pi05} "
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
failed=0

step() {  # step NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    echo "=== $name (limit ${seconds} s)"
    local start=$SECONDS
    if timeout "$seconds" "$@" >"$out/$name.log" 2>&1; then
        echo "=== $name: ok in $((SECONDS - start)) s"
    else
        echo "=== $name: FAILED (status $?) after $((SECONDS - start)) s"
        failed=$((failed + 1))
    fi
    tail -n 25 "$out/$name.log"
}

"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || { echo "no CUDA device here"; exit 1; }
"$py" -c "import torch; p = torch.cuda.get_device_properties(0); print(torch.__version__, p.name, p.multi_processor_count, 'SMs')" \
    | tee "$out/device.txt"
step test_gpu 150 "$py" -m pytest -q -p no:cacheprovider test_gpu
step bench_small 150 "$py" -m oxygen_ros.bench.oxygen_bench --preset small --device cuda --quick --out "$out/bench_small"
step bench_small_graphs 150 "$py" -m oxygen_ros.bench.oxygen_bench --preset small --device cuda --quick --cuda-graphs \
    --out "$out/bench_small_graphs"
# the real vocabulary at the goal point, float32 and bfloat16 side by side, with energy where NVML is installed
step bench_goals 240 "$py" -m oxygen_ros.bench.oxygen_bench --preset fullvocab --device cuda --goals \
    --dtype float32 bfloat16 --cuda-graphs --out "$out/bench_goals"
step fleet_profile 60 "$py" -m oxygen_ros.fleet.profile_cli --models a=small:0,b=small:1 --device cuda \
    --max-batch 8 --repeats 5 --warmup 2 --out "$out/fleet_lut_small.json"
# the same table with the action stage replayed from CUDA graphs per SM partition
step fleet_profile_graphs 60 "$py" -m oxygen_ros.fleet.profile_cli --models a=small:0,b=small:1 --device cuda \
    --max-batch 8 --repeats 5 --warmup 2 --cuda-graphs --out "$out/fleet_lut_small_graphs.json"
step bench_pi05 240 "$py" -m oxygen_ros.bench.oxygen_bench --preset pi05 --device cuda --quick --frames 6 \
    --out "$out/bench_pi05"
exit "$failed"
