"""sim-eval's `serve` path: the checkpoint behind `oxygen-ros serve`, gym-aloha driven through openpi's protocol.

`oxygen-ros serve --checkpoint CKPT --embodiment aloha --port 0` (or `aloha_sim`: the checkpoint's profile) runs as a
child process (as a user starts it); this process is the robot side of openpi's ALOHA sim example
(`examples/aloha_sim`): openpi-client's `WebsocketClientPolicy` wrapped in its `ActionChunkBroker` (one request per
chunk, the chunk's actions executed one per step, then the next request), stepping the sim at most 50 times a
second, each request what that example sends: `state` (the 14 joints), `images` `{"cam_high": 3 x 224 x 224 uint8}`
(the top camera resized with padding by openpi-client's `image_tools`, channel first) and `prompt` (the task text;
the example relies on the server's default prompt instead). The sim renders the top camera at the size the
checkpoint was trained on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..sim.aloha_env import DT, AlohaSimEnv, SimulationDiverged
from ..sim.evaluation import episode_record
from .processes import stop

REQUEST_SIZE = 224  # openpi's example resizes the top camera to 224 x 224 with padding
READY = re.compile(r"oxygen-ros serve: .* on ws://([0-9.]+):(\d+) ")
STARTUP_TIMEOUT_S = 300.0  # importing torch and loading the model, on a busy machine


class ServeChild:
    """`oxygen-ros serve` as a child process on a free port; its output kept for the report."""

    def __init__(self, args: list[str], env: dict, log: Path):
        self.log = open(log, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "oxygen_ros.commands.cli", "serve", "--port", "0",
                                         *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.port: int | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()
            match = READY.search(line)
            if match and self.port is None:
                self.port = int(match.group(2))
                self._ready.set()
        self._ready.set()  # it exited

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        if not self._ready.wait(timeout) or self.port is None:
            raise RuntimeError(f"oxygen-ros serve did not start (see {self.log.name})")
        return self.port

    def close(self) -> None:
        stop(self.process)
        self._reader.join(timeout=10)
        self.log.close()


class TimedPolicy:
    """A policy whose `infer` calls are timed (each one is a request and its chunk)."""

    def __init__(self, policy):
        self.policy, self.seconds = policy, []

    def infer(self, obs: dict) -> dict:
        started = time.perf_counter()
        result = self.policy.infer(obs)
        self.seconds.append(time.perf_counter() - started)
        return result

    def reset(self) -> None:
        self.policy.reset()


class ServedChunks:
    """The served policy as the delayed loop asks it (`sim/delayed_loop.py`): one openpi request per frame, its
    whole chunk [horizon, 14] of absolute joint targets back."""

    def __init__(self, client):
        self.client = client

    def chunk(self, images: dict[str, np.ndarray], qpos: np.ndarray, task: str, previous=None) -> np.ndarray:
        del previous  # guidance needs the model; the served chunk is handed over by the client's executor
        actions = self.client.infer(openpi_observation(images["top"], qpos, task))["actions"]
        return np.asarray(actions, dtype=np.float64)


def openpi_observation(image: np.ndarray, qpos: np.ndarray, prompt: str) -> dict:
    """The request openpi's ALOHA sim example builds from gym-aloha's observation, with the prompt."""
    from openpi_client import image_tools

    resized = image_tools.convert_to_uint8(image_tools.resize_with_pad(image, REQUEST_SIZE, REQUEST_SIZE))
    return {"state": np.asarray(qpos, dtype=np.float64), "images": {"cam_high": np.transpose(resized, (2, 0, 1))},
            "prompt": prompt}


def run_episode(env: AlohaSimEnv, broker, seed: int, max_hz: float = 1 / DT, frames: list | None = None) -> dict:
    """One seeded episode driven by `broker` (an `ActionChunkBroker`), paced to at most `max_hz` steps a second."""
    observation = env.reset(seed)
    broker.reset()
    succeeded_at, diverged = None, False
    period, next_step = 1.0 / max_hz if max_hz > 0 else 0.0, time.monotonic()
    try:
        while env.steps < env.max_steps:
            if frames is not None:
                frames.append(observation.images)
            action = broker.infer(openpi_observation(observation.images["top"], observation.qpos,
                                                     env.instruction))["actions"]
            next_step += period
            time.sleep(max(0.0, next_step - time.monotonic()))
            result = env.step(np.asarray(action, dtype=np.float64))
            observation = result.observation
            if result.success:
                succeeded_at = env.steps
                break
            if result.truncated:
                break
    except SimulationDiverged as err:
        print(f"sim-eval: seed {seed}: {err}; counted as a failure", file=sys.stderr)
        diverged = True
    return episode_record(env, seed, succeeded_at, diverged)


def serve_arguments(checkpoint: str, embodiment: str = "aloha") -> list[str]:
    """What a user gives `oxygen-ros serve` for a tiny checkpoint on a CPU in `embodiment` (the one it was trained
    in): float32, one thread, no narration."""
    return ["--checkpoint", str(checkpoint), "--embodiment", embodiment, "--device", "cpu", "-p", "model.dtype=float32",
            "-p", "model.cpu_threads=1"]
