#!/usr/bin/env bash
# The GPU checks and figures in one run, the most telling first, on a GPU machine's own python3 with no setup (no
# apt, no virtual environment, no ROS: the package is imported from the checkout; scripts/gpu_env.py lists what it
# imports, and a python lacking any of it is refused in one line naming every missing package).
# Usage: bash scripts/gpu_check.sh [--archive DIR] [OUT_DIR [STEP ...]]
# OUT_DIR (default out/gpu) gets each step's log and results; after every step, and after the preflight, all of
# OUT_DIR is packed again into DIR/gpu_check.tar.gz (DIR defaults to OUT_DIR), written beside and then renamed, so a
# run cut at any point, even killed, leaves an archive holding every step finished before the cut. The steps, in
# this order (each with its limit in seconds):
#   test_gpu      90  the CUDA suite
#   pi05_graphs  110  pi05 in bfloat16 with CUDA graphs at the goal points: one frame without narration
#                     (action_only) and with it (baseline, continuous batching), 50 tokens a request, one request
#                     a frame; action Hz, tokens/s, NVML energy per frame (one request a frame: per request)
#   frame_parts   60  where a pi05 frame's time goes: prefill, denoising and a decode step, eager and graphed,
#                     wall clock beside device time, and the kernels taking the device time
#   pi05_eager    90  the same as pi05_graphs without CUDA graphs (fewer frames: an eager frame is slow)
#   goals         90  the goal points on the real vocabulary (fullvocab), float32 and bfloat16, CUDA graphs on
#   fleet_profile 75  the fleet's stage table on green-context SM partitions, stage graphs on
#   fleet_bench  120  only when named (not in the default list: it would take the run past its budget): real
#                     fleet serving, monolithic against Robion side by side at four robot counts, on SM
#                     partitions with stage graphs, from fleet_profile's table where that step left one
#   summary       15  summary.md: the figures above beside the published ones they are compared with
# The whole run keeps within GPU_CHECK_BUDGET_S (default 540 s, 9 minutes): a step gets its limit or what is left,
# whichever is less, and one that would get under 30 s (or its whole limit, if smaller) is skipped, said in one
# line. A step past its limit gets SIGINT first, so its log ends where it was, and SIGKILL 10 s later; the budget
# counts from the script's start, so only the last step can overrun it, by those 10 s. The run goes on after a
# failed step; the exit status is the number of failed steps. Where the driver makes no SM partitions (device.txt
# says why), the partition tests (marker sm_partitions) and the fleet profile are left out.
set -u
cd "$(dirname "$0")/.."
archive_dir=""
if [ "${1:-}" = --archive ]; then
    archive_dir=${2:?--archive needs a folder}
    shift 2
fi
out=${1:-out/gpu}
shift || true
steps=" ${*:-test_gpu pi05_graphs frame_parts pi05_eager goals fleet_profile summary} "
budget=${GPU_CHECK_BUDGET_S:-540}
py=$(bash scripts/gpu_python.sh) || exit 1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out" "${archive_dir:=$out}"
archive=$(cd "$archive_dir" && pwd)/gpu_check.tar.gz
say() {  # on the console and in gpu_check.log, which goes into the archive
    echo "$@" | tee -a "$out/gpu_check.log"
}

pack() {  # status 1 of GNU tar: a file changed while read (the folder, as the archive is written into it)
    local status=0
    tar -czf "$archive.part" -C "$out" --warning=no-file-changed --exclude=gpu_check.tar.gz \
        --exclude=gpu_check.tar.gz.part . || status=$?
    [ "$status" -gt 1 ] || mv -f "$archive.part" "$archive"
}

partitions=yes
"$py" scripts/gpu_env.py --driver >"$out/device.txt" 2>&1 || partitions=no
if [ "$partitions" = no ]; then
    echo "preflight failed: no SM partitions here; leaving out the partition tests and the fleet profile" \
        >>"$out/device.txt"
fi
tee -a "$out/gpu_check.log" <"$out/device.txt"
pack
failed=0

step() {  # step NAME SECONDS COMMAND...
    local name=$1 seconds=$2
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    if [ "$partitions" = no ] && { [ "$name" = fleet_profile ] || [ "$name" = fleet_bench ]; }; then
        say "=== $name: skipped, no SM partitions here (device.txt)"
        return 0
    fi
    local left=$((budget - SECONDS)) least=$((seconds < 30 ? seconds : 30))
    if [ "$left" -lt "$least" ]; then
        say "=== $name: skipped, ${left} s of the ${budget} s budget left (GPU_CHECK_BUDGET_S)"
        return 0
    fi
    [ "$seconds" -le "$left" ] || seconds=$left
    say "=== $name (limit ${seconds} s)"
    local start=$SECONDS status=0
    timeout -s INT -k 10 "$seconds" "$@" >"$out/$name.log" 2>&1 || status=$?
    if [ "$status" = 0 ]; then
        say "=== $name: ok in $((SECONDS - start)) s"
    elif [ "$status" = 124 ]; then
        say "=== $name: FAILED, stopped at its limit after $((SECONDS - start)) s (the log ends where it was)"
    else
        say "=== $name: FAILED (status $status) after $((SECONDS - start)) s"
    fi
    [ "$status" = 0 ] || failed=$((failed + 1))
    tail -n 15 "$out/$name.log" | tee -a "$out/gpu_check.log"
    pack
}

# -v: one line per test as it passes, so a stopped run shows which test it was in; -rA: what passed tests printed
# (the figures they report rather than assert, e.g. a product's time on an SM partition)
partition_tests=()
[ "$partitions" = yes ] || partition_tests=(-m "not sm_partitions")
step test_gpu 90 "$py" -m pytest -v -rA -p no:cacheprovider "${partition_tests[@]}" test_gpu
pi05=(-m oxygen_ros.evaluation.bench.oxygen_bench --preset pi05 --device cuda --dtype bfloat16 --goals)
step pi05_graphs 110 "$py" "${pi05[@]}" --frames 8 --rounds 2 --cuda-graphs --out "$out/pi05_graphs"
step frame_parts 60 "$py" -m oxygen_ros.evaluation.bench.frame_parts --preset pi05 --dtype bfloat16 \
    --out "$out/frame_parts"
step pi05_eager 90 "$py" "${pi05[@]}" --frames 4 --rounds 1 --out "$out/pi05_eager"
step goals 90 "$py" -m oxygen_ros.evaluation.bench.oxygen_bench --preset fullvocab --device cuda --goals \
    --dtype bfloat16 float32 --cuda-graphs --out "$out/goals"
# two models' stages, buckets 1-4, every share the driver makes; fails rather than profile plain streams
step fleet_profile 75 "$py" -m oxygen_ros.commands.fleet_profile --models a=small:0,b=small:1 --device cuda \
    --max-batch 4 --repeats 3 --warmup 1 --require-sm-partitions --cuda-graphs --out "$out/fleet_lut_small.json"
# two models served by a monolithic and a Robion server at 30 Hz, every count whatever its attainment (2 s each)
fleet_lut=()
[ -f "$out/fleet_lut_small.json" ] && fleet_lut=(--profile "$out/fleet_lut_small.json")
step fleet_bench 120 "$py" -m oxygen_ros.commands.fleet_bench --models a=small:0,b=small:1 --device cuda \
    --max-batch 4 --repeats 3 --require-sm-partitions --cuda-graphs "${fleet_lut[@]}" --robots 8,16,32,64 \
    --rate 30 --slo 0.05,0.1 --duration 2 --all-counts --out "$out/fleet_bench"
step summary 15 "$py" scripts/gpu_summary.py "$out"
say "=== $failed failed step(s); everything in $archive"
pack
exit "$failed"
