"""What an owner watches in RViz: the plan the node published, drawn as a chart, and the latest narration as text.

RViz draws points in a frame, and a plan is joint values over time; turning those into arm poses needs the robot's
kinematics, which the node does not have. So the plan is drawn as a chart standing in the frame
(`visualization.frame_id`): one lane per action joint, `LANE_SPACING` apart along -y in the order of
`joints.action_names`; along x the time ahead of the plan's frame (`TIME_SCALE` metres per second); along z the
joint's value (`VALUE_SCALE` metres per unit, the unit of `action_chunk`). Each lane is a line through the plan's
points with a sphere at its end point (where the plan leaves the joint), and the narration floats above the chart.
The RViz model (`config/oxygen.rviz`) shows the robot itself beside it from `robot_description`.

Plain data here (`MarkerSpec`); `nodes/markers.py` turns it into visualization_msgs and publishes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIME_SCALE = 0.5  # metres of x per second ahead
VALUE_SCALE = 0.1  # metres of z per unit of a joint's value
LANE_SPACING = 0.05  # metres of -y between joints' lanes
TEXT_HEIGHT = 0.04  # metres: narration text size
TEXT_ABOVE = 0.4  # metres: narration above the chart's origin
PATH, ENDS, NARRATION = "plan_path", "plan_end", "narration"  # marker namespaces
LINE, SPHERES, TEXT = "line_strip", "sphere_list", "text"
_PALETTE = ((0.90, 0.30, 0.24), (0.18, 0.55, 0.84), (0.30, 0.69, 0.31), (0.95, 0.61, 0.07), (0.56, 0.27, 0.68),
            (0.10, 0.74, 0.74), (0.91, 0.12, 0.55))


@dataclass(frozen=True)
class MarkerSpec:
    namespace: str
    id: int
    kind: str  # LINE, SPHERES or TEXT
    points: tuple[tuple[float, float, float], ...]
    colors: tuple[tuple[float, float, float, float], ...]  # one per point, or one for the whole marker
    scale: float  # line width, sphere diameter or text height (metres)
    text: str = ""


def plan_markers(values: np.ndarray, step_s: float) -> list[MarkerSpec]:
    """Markers for a plan of `values` [steps, joints] whose point i lies (i + 1) steps ahead of its frame (as
    `chunk_to_trajectory` lays it out): a path per joint (id = the joint's index) and one sphere list of the end
    points (id 0). Ids are stable, so each plan replaces the previous one in RViz."""
    steps, joints = values.shape
    x = (np.arange(1, steps + 1) * step_s * TIME_SCALE).tolist()
    ends, end_colors, markers = [], [], []
    for j in range(joints):
        y = -j * LANE_SPACING
        z = (values[:, j] * VALUE_SCALE).tolist()
        color = (*_PALETTE[j % len(_PALETTE)], 1.0)
        markers.append(MarkerSpec(PATH, j, LINE, tuple((x[i], y, z[i]) for i in range(steps)), (color,), 0.005))
        ends.append((x[-1], y, z[-1]))
        end_colors.append(color)
    markers.append(MarkerSpec(ENDS, 0, SPHERES, tuple(ends), tuple(end_colors), 0.02))
    return markers


def narration_marker(text: str) -> MarkerSpec:
    """The narration, above the chart; id 0, so each final narration replaces the last."""
    return MarkerSpec(NARRATION, 0, TEXT, ((0.0, 0.0, TEXT_ABOVE),), ((1.0, 1.0, 1.0, 1.0),), TEXT_HEIGHT, text)
