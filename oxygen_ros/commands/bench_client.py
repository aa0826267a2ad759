"""One benchmark client of `oxygen-ros serve-bench`: openpi-client's `WebsocketClientPolicy` in its own process,
DROID's request (two 224 x 224 x 3 images, joints, gripper, prompt) at a fixed rate or back to back.

`python -m oxygen_ros.commands.bench_client PORT SECONDS RATE_HZ SEED` connects, warms up, prints ``ready``, reads
the start time (epoch seconds, the same for every client) from its standard input, waits for it, sends requests
for SECONDS and prints one JSON object: per request its completion time (s after the start), round trip and the
server's engine time (ms). Only numpy and openpi-client are imported: a client costs what a robot's laptop would
pay.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

WARMUP_REQUESTS = 3


def droid_request(seed: int, size: int = 224) -> dict:
    rng = np.random.default_rng(seed)
    return {"observation/exterior_image_1_left": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/wrist_image_left": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            "observation/joint_position": rng.uniform(-1, 1, 7), "observation/gripper_position": rng.uniform(0, 1, 1),
            "prompt": "put the marker in the cup"}


def run(port: int, seconds: float, rate_hz: float, seed: int) -> dict:
    policy = WebsocketClientPolicy("127.0.0.1", port)
    obs = droid_request(seed)
    for _ in range(WARMUP_REQUESTS):
        policy.infer(obs)
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    late_s = time.time() - start_at
    time.sleep(max(0.0, -late_s))
    begin = time.perf_counter() - max(0.0, late_s)  # perf_counter at START_AT
    done, rtt, engine = [], [], []
    period, due = 1.0 / rate_hz if rate_hz else 0.0, begin
    while due < begin + seconds:
        time.sleep(max(0.0, due - time.perf_counter()))
        start = time.perf_counter()
        reply = policy.infer(obs)
        end = time.perf_counter()
        due = max(due + period, end)  # a tick missed while waiting for a reply is skipped, not sent in a burst
        done.append(end - begin)
        rtt.append(1e3 * (end - start))
        engine.append(float(reply["policy_timing"]["infer_ms"]))
    policy._ws.close()  # openpi-client has no close(); its connection does
    return {"done_s": done, "rtt_ms": rtt, "engine_ms": engine, "late_s": max(0.0, late_s)}


if __name__ == "__main__":
    port, seconds, rate, seed = sys.argv[1:5]
    print(json.dumps(run(int(port), float(seconds), float(rate), int(seed))))
