"""QoS between rclpy and a rosbag2's `offered_qos_profiles`: what the recorder stores, what replay publishes with.

The recorder stores each publisher's offered profile as discovered (remote endpoints report no history depth:
`unknown`, 0, exactly as rosbag2 records them). Replay publishes a topic so that every subscriber that matched
the recorded publishers matches it too: reliable only if every recorded publisher was, transient local only if
every one was; the depth is the largest recorded one, or when none is known 1 for a latched topic (its last
value) and 100 otherwise. Deadline, lifespan and liveliness are not replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

from oxygen_ros.data.stamps import split_ns

LATCHED_DEFAULT_DEPTH = 1
STREAM_DEFAULT_DEPTH = 100


def _time(duration: Duration) -> QosTime:
    sec, nsec = split_ns(duration.nanoseconds)
    return QosTime(sec=sec, nsec=nsec)


def _member(enum, policy):
    """The rosbags enum member named like the rclpy policy (the two share names); UNKNOWN if none is."""
    return enum.__members__.get(getattr(policy, "name", ""), enum.UNKNOWN)


def offered_profile(profile: QoSProfile) -> Qos:
    """A publisher's QoS (as `get_publishers_info_by_topic` reports it) in the form the bag stores."""
    return Qos(
        history=_member(QosHistory, profile.history), depth=int(profile.depth),
        reliability=_member(QosReliability, profile.reliability),
        durability=_member(QosDurability, profile.durability),
        deadline=_time(profile.deadline), lifespan=_time(profile.lifespan),
        liveliness=_member(QosLiveliness, profile.liveliness),
        liveliness_lease_duration=_time(profile.liveliness_lease_duration),
        avoid_ros_namespace_conventions=bool(profile.avoid_ros_namespace_conventions),
    )


def replay_profile(offered: Sequence[Qos]) -> QoSProfile:
    """The profile to republish a topic with, from its recorded publishers' offers (at least one)."""
    if not offered:
        raise ValueError("no recorded QoS profile to replay with")
    reliable = all(q.reliability == QosReliability.RELIABLE for q in offered)
    latched = all(q.durability == QosDurability.TRANSIENT_LOCAL for q in offered)
    depths = [q.depth for q in offered if q.history == QosHistory.KEEP_LAST and q.depth > 0]
    depth = max(depths) if depths else (LATCHED_DEFAULT_DEPTH if latched else STREAM_DEFAULT_DEPTH)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=depth,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE,
    )
