"""EngineStatus (numbers for rqt_plot) and DiagnosticArray (OK/WARN/ERROR for rqt_robot_monitor) from one snapshot.

Levels: ERROR when the model raised on the last tick, its text head ended the last narration with non-finite
logits, the language worker died or configuring the node failed;
WARN while the node does not act (not active, waiting for a camera or the joint state, stale frames, a plan refused
by the joint limits) or acts below 90 % of its control rate; OK otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from oxygen_ros.engine.runtime import RuntimeStats
from oxygen_ros.msg import EngineStatus

from .frame_inputs import MODEL_ERROR, RUNNING

RATE_WARN_FRACTION = 0.9
CONFIGURE_FAILED = "configure_failed"  # a managed node's configure failed: it stays unconfigured
NO_STATS = RuntimeStats(0.0, 0.0, 0.0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0)  # a node not configured: no engine yet


@dataclass
class Health:
    """What the node knows about itself at one status tick."""

    state: str
    detail: str  # why, in words (missing cameras, the last model error, ...)
    stats: RuntimeStats
    target_rate_hz: float
    actions_published: int
    dropped_frames: int
    worker_error: str | None = None
    language_error: str | None = None  # the text head's last failure (non-finite logits), until a narration ends well
    values: dict[str, object] = field(default_factory=dict)  # extra key-values (counters, latencies)


def engine_status(health: Health, stamp: Time) -> EngineStatus:
    s = health.stats
    msg = EngineStatus()
    msg.header.stamp = stamp
    msg.state = health.state
    msg.action_rate_hz = float(s.action_rate_hz)
    msg.action_latency_p50_ms = float(s.action_latency_p50_ms)
    msg.action_latency_p99_ms = float(s.action_latency_p99_ms)
    msg.actions_published = health.actions_published
    msg.deadline_misses = s.deadline_misses
    msg.dropped_frames = health.dropped_frames
    msg.language_tokens_per_s = float(s.tokens_per_s)
    msg.active_language_requests = s.active_requests
    msg.language_requests_dropped = s.requests_dropped
    msg.kv_slots_used = s.slots_used
    msg.kv_slots_total = s.slots_total
    msg.kv_bytes_used = s.bytes_used
    msg.kv_bytes_total = s.bytes_total
    return msg


def level_and_message(health: Health) -> tuple[bytes, str]:
    if health.worker_error:
        return DiagnosticStatus.ERROR, f"language worker stopped: {health.worker_error}"
    if health.state == MODEL_ERROR:
        return DiagnosticStatus.ERROR, f"model error: {health.detail}"
    if health.language_error:
        return DiagnosticStatus.ERROR, f"language model error: {health.language_error}"
    if health.state == CONFIGURE_FAILED:
        return DiagnosticStatus.ERROR, f"configure failed, unconfigured: {health.detail}"
    if health.state != RUNNING:
        return DiagnosticStatus.WARN, f"{health.state}: {health.detail}" if health.detail else health.state
    rate = health.stats.action_rate_hz
    if rate < RATE_WARN_FRACTION * health.target_rate_hz:
        return DiagnosticStatus.WARN, f"acting at {rate:.1f} Hz of {health.target_rate_hz:g} Hz"
    return DiagnosticStatus.OK, f"acting at {rate:.1f} Hz"


def diagnostic_array(health: Health, stamp: Time, name: str, hardware_id: str) -> DiagnosticArray:
    level, message = level_and_message(health)
    s = health.stats
    values = {
        "state": health.state,
        "action_rate_hz": f"{s.action_rate_hz:.2f}",
        "target_rate_hz": f"{health.target_rate_hz:g}",
        "action_latency_p50_ms": f"{s.action_latency_p50_ms:.2f}",
        "action_latency_p99_ms": f"{s.action_latency_p99_ms:.2f}",
        "actions_published": health.actions_published,
        "deadline_misses": s.deadline_misses,
        "dropped_frames": health.dropped_frames,
        "language_tokens_per_s": f"{s.tokens_per_s:.1f}",
        "active_language_requests": s.active_requests,
        "language_requests_dropped": s.requests_dropped,
        "kv_slots_used": s.slots_used,
        "kv_slots_total": s.slots_total,
        "kv_usage_percent": f"{100.0 * s.bytes_used / s.bytes_total:.1f}" if s.bytes_total else "0.0",
        "text_floor_steps": s.floor_steps,
        "text_floor_action_ms": f"{1e3 * s.floor_action_s:.1f}",
        **health.values,
    }
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [status]
    return array
