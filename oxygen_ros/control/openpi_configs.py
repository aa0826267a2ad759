"""What openpi's pi0.5 train configs train, by config name: the action space an embodiment profile must match.

openpi names a checkpoint by its train config (`serve_policy.py --policy.config=NAME`, the converter's
`--config_name`, training's `checkpoints/NAME/EXP/STEP/`); its norm stats' asset id says less: configs that share
an asset id can train different action spaces. From openpi `src/openpi/training/config.py` at 15a9616:

| config | lines | data config | actions |
|---|---|---|---|
| `pi05_droid` | 629-642 | `SimpleDataConfig` + `DroidInputs` / `DroidOutputs` | joint velocities + gripper position |
| `pi05_droid_finetune` | 895-918 | `LeRobotDROIDDataConfig` ("We assume joint *velocity* actions", line 450) | the same |
| `pi05_full_droid_finetune` | 861-894 | `RLDSDroidDataConfig`, `action_space=JOINT_POSITION`: `DeltaActions(make_bool_mask(7, -1))` (lines 403-409) | 7 joint-position deltas from the state + gripper position |
| `pi05_aloha`, `pi05_aloha_pen_uncap` | 564-579, 798-826 | `LeRobotAlohaDataConfig` | ALOHA's deltas (the `aloha` profile) |
| `pi05_libero` | 744; 326-343 (its data config) | `LeRobotLiberoDataConfig` | end-effector deltas: no profile can drive them |
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpenpiConfig:
    """`profile`: the shipped profile whose name fits; `kinds`: else the exact action kinds a profile needs (any
    name); `refused`: why no profile fits."""

    actions: str
    profile: str | None = None
    kinds: tuple[str, ...] | None = None
    refused: str = ""


_DROID_VELOCITY = OpenpiConfig("DROID's normalized joint velocities and gripper position", profile="droid")
_ALOHA = OpenpiConfig("ALOHA's joint deltas in pi's signs and gripper units", profile="aloha")
OPENPI_CONFIGS = {
    "pi05_droid": _DROID_VELOCITY,
    "pi05_droid_finetune": _DROID_VELOCITY,
    "pi05_full_droid_finetune": OpenpiConfig(
        "7 joint-position deltas from the frame's state and the gripper position (RLDSDroidDataConfig, "
        "action_space JOINT_POSITION)", kinds=("delta",) * 7 + ("gripper",)),
    "pi05_aloha": _ALOHA,
    "pi05_aloha_pen_uncap": _ALOHA,
    "pi05_libero": OpenpiConfig("LIBERO's end-effector deltas", refused="end_effector"),
}
