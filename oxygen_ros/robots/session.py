"""One robot's session with the engine: its observation made the model's, and the model's chunk made its command.

Every front end keeps one per robot (the VLA node its one, the fleet node one per robot it serves): on the way in,
the state goes through the robot's embodiment profile into the model's space, the instruction is fitted to the
model's prompt with that state (`robots.instruction`), and the observation is prepared and queued as a frame of the
robot; on the way out, a chunk is unnormalized to the robot's action dims and made its absolute command from the
state of the frame the model saw (never a newer one: a delta or a velocity is relative to what the model saw),
which then goes through the robot's command path (`robots.command_path`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oxygen_ros.control.embodiment import Embodiment
from oxygen_ros.engine.frames import ActionFrame
from oxygen_ros.engine.runtime import DEFAULT_MODEL, ActionChunk, Runtime
from oxygen_ros.model.preprocess import Observation

from .instruction import Instruction


class RobotSession:
    def __init__(self, runtime: Runtime, embodiment: Embodiment, instruction: Instruction | None, action_dims: int,
                 model_id: str = DEFAULT_MODEL):
        """`instruction`: the robot's task (None where each observation brings its own, as an openpi client's
        does); `action_dims`: the robot's action joints (the command's width, velocities beside where the profile
        has them); `model_id`: the robot's model in `runtime`."""
        self.runtime, self.embodiment, self.instruction = runtime, embodiment, instruction
        self.action_dims, self.model_id = action_dims, model_id

    def observation(self, images: dict[str, np.ndarray], state: np.ndarray) -> tuple[Observation, str | None]:
        """The observation the model takes from camera images and the robot's state (robot units), and what
        fitting the instruction to the prompt did (`Instruction.fit_prompt`: "cut", "previous" or None)."""
        served = self.runtime.served[self.model_id]
        model_state = self.embodiment.state_to_model(state)
        fitted = self.instruction.fit_prompt(served.tokenizer, model_state, served.model.config, served.norm_stats)
        return Observation(images=images, state=model_state, task=self.instruction.text), fitted

    def frame(self, images: dict[str, np.ndarray], state: np.ndarray, narrate: bool, *, stamp_ns: int = 0,
              age_s: float = 0.0, context: Any = None, arrival: float | None = None, committed=None
              ) -> tuple[ActionFrame, str | None]:
        """`observation`, prepared into the model's inputs and made a frame of this robot (not yet queued);
        `committed`: the chunk being executed and the delay, for real-time chunking (`robots.rtc_guide`)."""
        observation, fitted = self.observation(images, state)
        inputs = self.runtime.prepare(observation, self.model_id)
        return self.runtime.frame(inputs, narrate, model_id=self.model_id, stamp_ns=stamp_ns, age_s=age_s,
                                  context=context, arrival=arrival, committed=committed), fitted

    def command(self, chunk: ActionChunk, state: np.ndarray) -> np.ndarray:
        """The robot's absolute command [H, joints (x2 with velocities)] the embodiment makes of `chunk` from the
        state of the frame the model saw."""
        actions = self.runtime.robot_actions(chunk, self.action_dims, self.model_id)
        return self.embodiment.actions_to_robot(actions, state).stacked()

    def openpi_actions(self, chunk: ActionChunk, state: np.ndarray, dims: int) -> np.ndarray:
        """What openpi's policy returns for this robot [H, dims] (`Embodiment.openpi_actions`), for an openpi
        client whose reply width is `dims`."""
        return self.embodiment.openpi_actions(self.runtime.robot_actions(chunk, dims, self.model_id), state)
