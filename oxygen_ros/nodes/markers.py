"""The VLA node's `chunk_markers` (visualization_msgs/MarkerArray) for RViz, when `visualization.markers` is true:
the published plan as a chart and the final narrations as text (`control/plan_markers.py` says what is drawn).

Plans come from the control path, narrations from the language worker's thread; each publishes only its own
markers, so the two share no state (rclpy publishers are safe to use from another thread).
"""

from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from oxygen_ros.control.plan_markers import LINE, SPHERES, TEXT, MarkerSpec, narration_marker, plan_markers

from .conversions import ns_to_stamp

TOPIC = "chunk_markers"
_TYPES = {LINE: Marker.LINE_STRIP, SPHERES: Marker.SPHERE_LIST, TEXT: Marker.TEXT_VIEW_FACING}


def marker_array(specs: list[MarkerSpec], frame_id: str, stamp_ns: int) -> MarkerArray:
    array = MarkerArray()
    for spec in specs:
        marker = Marker(ns=spec.namespace, id=spec.id, type=_TYPES[spec.kind],
                        action=Marker.ADD, text=spec.text, lifetime=Duration(), frame_locked=False)
        marker.header.frame_id = frame_id
        marker.header.stamp = ns_to_stamp(stamp_ns)
        marker.pose.orientation.w = 1.0
        marker.scale.x = marker.scale.y = marker.scale.z = spec.scale
        points = [Point(x=x, y=y, z=z) for x, y, z in spec.points]
        if spec.kind == TEXT:
            marker.pose.position = points[0]
        else:
            marker.points = points
        colors = [ColorRGBA(r=r, g=g, b=b, a=a) for r, g, b, a in spec.colors]
        marker.color = colors[0]
        if len(colors) == len(spec.points) > 1:
            marker.colors = colors
        array.markers.append(marker)
    return array


class MarkerOutput:
    """Publishes `chunk_markers` on `publisher` (a MarkerArray publisher on TOPIC, made by the node so that it goes
    with the node's other outputs); with None, every call is a no-op."""

    def __init__(self, publisher, frame_id: str):
        self.frame_id = frame_id
        self._publisher = publisher

    def plan(self, values: np.ndarray, step_s: float, stamp_ns: int) -> None:
        """The plan just published on action_chunk (its values and header stamp)."""
        if self._publisher is not None:
            self._publisher.publish(marker_array(plan_markers(values, step_s), self.frame_id, stamp_ns))

    def narration(self, text: str, stamp_ns: int) -> None:
        if self._publisher is not None:
            self._publisher.publish(marker_array([narration_marker(text)], self.frame_id, stamp_ns))
