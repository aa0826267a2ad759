"""sim-eval's `ros` path: the checkpoint in `vla_node`, gym-aloha in `sim_node`, over DDS on sim time.

Both nodes run as child processes on an isolated DDS domain, started the way `oxygen-ros sim-demo` starts them
(the VLA node with config/aloha.yaml and config/demo_tiny.yaml, then the overrides: sim time, autostart, the
sim's camera topics, `model.checkpoint`, float32 on one CPU thread, no narration). sim_node runs one episode per
held-out seed (`seeds`), ends each at gym-aloha's top reward stage or its 300 steps, hands over between chunks
with `--blending`, tells the VLA node of each episode's start through its `~/reset` service (`policy_reset`: the
node forgets the previous episode's chunks and frames), records the episodes (JPEG frames) and prints its summary,
from which each episode's seed, best reward stage and length are read. Chunk latency is sim_node's: the steps from the camera frame a chunk was
computed from to the step it arrived at.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from ..sim.aloha_env import DT
from .processes import demo_env, python_command, stop, wait_for_exit
from .sim_demo import policy_command, sim_summary

VLA_NODE = "oxygen_ros.nodes.vla_node"
VLA_RESET = "/vla_node/reset"  # the VLA node's episode start (`vla_node`'s `~/reset`)
MAX_AGES_S = {"control.max_image_age_s": 0.2, "control.max_state_age_s": 0.5}  # config/aloha.yaml's, the node's
STARTUP_S = 240.0  # both nodes importing torch and rclpy, the model loading, on a busy machine


def sim_node_command(seeds: list[int], cameras: list[str], size: tuple[int, int], blending: str, rate_hz: float,
                     steps: int, record: Path, delay_steps: int = 0, policy_reset: str = "") -> list[str]:
    params = {"task": "transfer_cube", "episode_steps": steps, "inject_delay_steps": delay_steps,
              "blending": blending, "cameras": f"[{','.join(cameras)}]",
              "image_height": size[0], "image_width": size[1], "seeds": f"[{','.join(map(str, seeds))}]",
              "max_episodes": len(seeds), "rate_hz": rate_hz, "record_path": record, "record_compress": "true",
              "wait_for_policy": "true", **({"policy_reset": policy_reset} if policy_reset else {})}
    return [*python_command("oxygen_ros.nodes.sim_node"), "--ros-args",
            *(x for name, value in params.items() for x in ("-p", f"{name}:={value}"))]


def policy_node_command(policy: str, checkpoint: str, cameras: list[str], rate_hz: float, extra: list[str],
                        out: Path, delay_steps: int = 0) -> list[str]:
    """The policy node as sim-demo starts it (by default the VLA node), on the checkpoint: float32 on one CPU
    thread, no narration, then `extra` (NAME:=VALUE). With an injected delay every frame reaches the node
    `delay_steps` late by design, so its age limits grow by as much (a frame is still stale past its usual limit)."""
    ages = [f"{name}:={limit + delay_steps * DT:g}" for name, limit in MAX_AGES_S.items()] if delay_steps else []
    params = [f"model.checkpoint:={Path(checkpoint).resolve()}", "model.dtype:=float32", "model.device:=cpu",
              "model.cpu_threads:=1", "language.policy:=off", "control.horizon:=0", *ages, *extra]
    args = argparse.Namespace(policy=policy, cameras=cameras, params_file=None, preset="tiny", policy_rate=rate_hz,
                              policy_param=params)
    return policy_command(args, out)


def evaluate(checkpoint: str, seeds: list[int], cameras: list[str], size: tuple[int, int], blending: str,
             policy_rate_hz: float, sim_rate_hz: float, steps: int, out: Path, policy_params: list[str] | None = None,
             user_domain: bool = False, policy: str = VLA_NODE, delay_steps: int = 0) -> dict:
    """Run the episodes; {"episodes": records, "summary": sim_node's summary, "record": folder of episodes}."""
    out.mkdir(parents=True, exist_ok=True)
    record = out / "episodes"
    env = demo_env(user_domain, "sim-eval")
    sim_log, policy_log = out / "sim_node.log", out / "policy.log"
    seconds = len(seeds) * steps * DT
    timeout = STARTUP_S + seconds * (4.0 if sim_rate_hz > 0 else 2.0)
    with open(sim_log, "w") as sim_out, open(policy_log, "w") as policy_out:
        sim = subprocess.Popen(sim_node_command(seeds, cameras, size, blending, sim_rate_hz, steps, record,
                                                delay_steps, VLA_RESET if policy == VLA_NODE else ""), env=env,
                               stdout=sim_out, stderr=subprocess.STDOUT)
        node = subprocess.Popen(policy_node_command(policy, checkpoint, cameras, policy_rate_hz, policy_params or [],
                                                    out, delay_steps), env=env, stdout=policy_out, stderr=subprocess.STDOUT)
        try:
            failure = wait_for_exit({"sim": sim}, {"policy": node}, timeout)
        finally:
            sim_status = stop(sim)
            stop(node)
    summary = sim_summary(sim_log.read_text())
    if failure or sim_status != 0 or summary is None:
        failed_log = policy_log if failure and node.returncode not in (0, None) else sim_log
        tail = "\n".join(failed_log.read_text().splitlines()[-10:])
        raise RuntimeError(f"{failure or f'sim_node exited with status {sim_status}'} (see {failed_log}):\n{tail}")
    top = summary["task_max_reward"]
    episodes = [{"seed": seed, "max_reward": best, "success": best >= top, "steps": steps,
                 "success_step": steps if best >= top else None, "diverged": diverged}
                for seed, best, steps, diverged in zip(summary["episode_seeds"], summary["episode_max_rewards"],
                                                        summary["episode_lengths"], summary["episode_diverged"])]
    return {"episodes": episodes, "summary": summary, "record": record}
