#!/usr/bin/env bash
# The GPU checks and figures in one run: the CUDA test suite, the OxyGen benchmark on `small` and `pi05` (bf16), and
# a green-context fleet profile (with and without CUDA graphs). Needs a python whose torch is a CUDA build (chosen by
# scripts/gpu_python.sh: $GPU_PY, else .venv/bin/python, else python3) with this package's dependencies and the
# `gpu` extra (cuda-bindings for the SM partitions, nvidia-ml-py for the energy figures); no ROS.
# Usage: bash scripts/gpu_check.sh [OUT_DIR [STEP ...]]   (default out/gpu, every step in this order:
# test_gpu bench_pi05 bench_small fleet_profile bench_goals bench_small_graphs fleet_profile_graphs).
# The whole run keeps within GPU_CHECK_BUDGET_S (default 480 s: a machine lent for a short while must have time left
# to start and to rerun): each step gets its own limit (3-5x its estimate; none of it has run on a GPU yet) or what
# is left of the budget, whichever is less, and a step that would get under 30 s is skipped, said in one line. The
# run goes on after a failed step, so one slow step does not lose the others' results; a step past its limit gets
# SIGINT first, so its log ends with where it was (pytest's summary, Python's traceback). The exit status is the
# number of failed steps; without a usable GPU it stops at once with one line. Where the driver makes no SM
# partitions (no green contexts, no cuda-bindings: the preflight's lines in device.txt say which), the run
# goes on without what needs them: the partition tests (marker sm_partitions) and both fleet profiles.
set -u
cd "$(dirname "$0")/.."
out=${1:-out/gpu}
shift || true
steps=" ${*:-test_gpu bench_pi05 bench_small fleet_profile bench_goals bench_small_graphs fleet_profile_graphs} "
budget=${GPU_CHECK_BUDGET_S:-480}
py=$(bash scripts/gpu_python.sh) || exit 1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out"
partitions=yes
"$py" scripts/gpu_env.py --driver >"$out/device.txt" 2>&1 || partitions=no
if [ "$partitions" = no ]; then
    echo "preflight failed: no SM partitions here; skipping the partition tests and the fleet profiles" \
        >>"$out/device.txt"
fi
cat "$out/device.txt"
# bench_pi05 is the only source of real GPU memory figures for the released shapes, and it writes them only when it
# ends: cut by the budget it leaves nothing. So it runs second, and until it has run the steps before it keep
# `reserve` seconds of the budget for it (half the budget, at most 240 s: its ~200 s estimate with a margin); the
# CUDA tests stay first, as the proof that the CUDA paths work at all, within what the reserve leaves them.
reserve=0
[[ $steps != *" bench_pi05 "* ]] || reserve=$((budget / 2 < 240 ? budget / 2 : 240))
failed=0

step() {  # step NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    if [ "$partitions" = no ] && [[ $name == fleet_profile* ]]; then
        echo "=== $name: skipped, no SM partitions here (device.txt)"
        return 0
    fi
    local left=$((budget - SECONDS - reserve))
    if [ "$left" -lt 30 ]; then
        local kept=""
        [ "$reserve" = 0 ] || kept=", besides the ${reserve} s kept for bench_pi05"
        echo "=== $name: skipped, ${left} s of the ${budget} s budget left (GPU_CHECK_BUDGET_S$kept)"
        return 0
    fi
    [ "$seconds" -le "$left" ] || seconds=$left
    echo "=== $name (limit ${seconds} s)"
    local start=$SECONDS status=0
    timeout -s INT -k 30 "$seconds" "$@" >"$out/$name.log" 2>&1 || status=$?
    if [ "$status" = 0 ]; then
        echo "=== $name: ok in $((SECONDS - start)) s"
    elif [ "$status" = 124 ]; then
        echo "=== $name: FAILED, stopped at its limit after $((SECONDS - start)) s (the log ends where it was)"
    else
        echo "=== $name: FAILED (status $status) after $((SECONDS - start)) s"
    fi
    [ "$status" = 0 ] || failed=$((failed + 1))
    tail -n 25 "$out/$name.log"
}

# -v: one line per test as it passes, so a stopped run shows which test it was in; -rA: what passed tests printed
# (the figures they report rather than assert, e.g. a product's time on an SM partition)
partition_tests=()
[ "$partitions" = yes ] || partition_tests=(-m "not sm_partitions")
step test_gpu 300 "$py" -m pytest -v -rA -p no:cacheprovider "${partition_tests[@]}" test_gpu
reserve=0
# 3.35 B parameters initialised on the CPU, then the reduced matrix (about 200 s by estimate)
step bench_pi05 420 "$py" -m oxygen_ros.evaluation.bench.oxygen_bench --preset pi05 --device cuda --quick --frames 6 \
    --out "$out/bench_pi05"
step bench_small 240 "$py" -m oxygen_ros.evaluation.bench.oxygen_bench --preset small --device cuda --quick --out "$out/bench_small"
# every share the driver makes, buckets 1-4: 2 models x 2 stages x 3 buckets x ~10 shares x 4 runs, then the
# co-run rounds (about 30 s by estimate); fails rather than profile plain streams if there are no SM partitions
step fleet_profile 150 "$py" -m oxygen_ros.commands.fleet_profile --models a=small:0,b=small:1 --device cuda \
    --max-batch 4 --repeats 3 --warmup 1 --require-sm-partitions --out "$out/fleet_lut_small.json"
# the real vocabulary at the goal point, float32 and bfloat16 side by side, with energy where NVML is installed
step bench_goals 300 "$py" -m oxygen_ros.evaluation.bench.oxygen_bench --preset fullvocab --device cuda --goals \
    --dtype float32 bfloat16 --cuda-graphs --out "$out/bench_goals"
step bench_small_graphs 240 "$py" -m oxygen_ros.evaluation.bench.oxygen_bench --preset small --device cuda --quick --cuda-graphs \
    --out "$out/bench_small_graphs"
# the same table with the action stage replayed from CUDA graphs per SM partition (a capture per stream and bucket)
step fleet_profile_graphs 180 "$py" -m oxygen_ros.commands.fleet_profile --models a=small:0,b=small:1 --device cuda \
    --max-batch 4 --repeats 3 --warmup 1 --require-sm-partitions --cuda-graphs \
    --out "$out/fleet_lut_small_graphs.json"
echo "=== $failed failed step(s); logs in $out"
exit "$failed"
