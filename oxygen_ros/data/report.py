"""`oxygen-ros report BAG [--episode-bag EBAG | --episode SRC] --out DIR`: what did the VLA node do on an episode?

BAG is what `oxygen-ros record` captured while an episode bag was replayed into the node. The report gives
per-topic rates, action latency (chunk receive time minus the chunk's header stamp, which the node sets to the
stamp of the camera frame it acted on), the narration timeline, and a plot of every action chunk against the
episode's recorded actions (`actions.png`), written with report.json and report.md into DIR. With the episode it
also scores the policy: the chunks' error against the recorded actions, per joint (matched by name) and overall,
and how many narrations equal the caption `data.captions` derives for their frame.

Time alignment: the recorded action of frame k is the target commanded at that frame for the next control step,
and the node puts a chunk's point i (predicted for frame t + i) at `(i + 1)` steps after the chunk's frame stamp
t; so a point at time T is compared with the recorded action stamped T - one step (the episode's median frame
interval), and the plot draws recorded actions at that target time.

Replayed frames keep the episode's stamps, so receive times are converted to bag time first: through the
recorded /clock (replay with --clock) when present, otherwise used as they are when they are on the same clock
as the stamps (recording with use_sim_time, or a live robot). Otherwise latency is reported as unavailable.

Every input is read (and the bags checked against their metadata's message counts) before DIR is touched; a new
DIR appears only complete, so a failure leaves no empty or half-written folder. `--allow-partial` reports on a
damaged bag's readable messages with a warning instead of refusing it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..command_line import CommandParser
from ..engine.stats import percentile
from .aloha import aloha_episode_path, read_aloha
from .atomic import output_folder
from .bag import read_messages
from .captions import frame_captions
from .episode import DataError
from .episode_bag import ACTION_TOPIC, DEFAULT_BASE_TIME_NS, base_time_seconds
from .lerobot import read_lerobot
from .stamps import NS_PER_S, stamp_to_ns

CHUNK_TYPE = "trajectory_msgs/msg/JointTrajectory"
NARRATION_TYPE = "oxygen_ros/msg/Narration"
CLOCK_TYPE = "rosgraph_msgs/msg/Clock"
SAME_CLOCK_LIMIT_NS = 3600 * NS_PER_S  # stamps more than an hour from receive times are on another clock


@dataclass
class Recording:
    """What the report needs from the recorded bag, decoded once."""

    log_times: dict[str, list[int]] = field(default_factory=dict)
    chunks: list[dict] = field(default_factory=list)  # receive_ns, stamp_ns, joint_names, times_s, positions
    narration: list[dict] = field(default_factory=list)
    clock: list[tuple[int, int]] = field(default_factory=list)  # (log time, clock value)


def load_recording(bag: str | os.PathLike, on_incomplete: Callable[[str], None] | None = None) -> Recording:
    rec = Recording()
    for raw, msg in read_messages(bag, on_incomplete=on_incomplete):
        rec.log_times.setdefault(raw.topic, []).append(raw.log_time_ns)
        if raw.msgtype == CHUNK_TYPE and len(msg.points):
            rec.chunks.append({
                "topic": raw.topic, "receive_ns": raw.log_time_ns, "stamp_ns": stamp_to_ns(msg.header.stamp),
                "joint_names": list(msg.joint_names),
                "times_s": np.array([stamp_to_ns(p.time_from_start) / 1e9 for p in msg.points]),
                "positions": np.stack([np.asarray(p.positions, dtype=np.float64) for p in msg.points]),
            })
        elif raw.msgtype == NARRATION_TYPE:
            rec.narration.append({
                "topic": raw.topic, "receive_ns": raw.log_time_ns, "stamp_ns": stamp_to_ns(msg.header.stamp),
                "request_id": int(msg.request_id), "text": str(msg.text), "num_tokens": int(msg.num_tokens),
                "final": bool(msg.final),
            })
        elif raw.msgtype == CLOCK_TYPE:
            rec.clock.append((raw.log_time_ns, stamp_to_ns(msg.clock)))
    return rec


def topic_rates(rec: Recording) -> dict[str, dict]:
    rates = {}
    for topic, times in sorted(rec.log_times.items()):
        span = (times[-1] - times[0]) / 1e9 if len(times) > 1 else 0.0
        rates[topic] = {"count": len(times), "duration_s": span,
                        "rate_hz": (len(times) - 1) / span if span > 0 else None}
    return rates


def receive_in_bag_time(rec: Recording, receive_ns: np.ndarray, stamps_ns: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Receive times on the stamps' clock, and how they were obtained (or why they could not be)."""
    if len(rec.clock) >= 2:
        log, value = (np.array(x, dtype=np.float64) for x in zip(*sorted(rec.clock)))
        return np.interp(receive_ns.astype(np.float64), log, value), "recorded /clock"
    if len(stamps_ns) and np.median(np.abs(receive_ns - stamps_ns)) < SAME_CLOCK_LIMIT_NS:
        return receive_ns.astype(np.float64), "receive times (same clock as stamps)"
    return None, "stamps and receive times are on different clocks; replay with --clock and record /clock"


def action_latency(rec: Recording) -> dict:
    if not rec.chunks:
        return {"available": False, "reason": f"no {CHUNK_TYPE} messages in the bag"}
    receive = np.array([c["receive_ns"] for c in rec.chunks], dtype=np.int64)
    stamps = np.array([c["stamp_ns"] for c in rec.chunks], dtype=np.int64)
    bag_time, source = receive_in_bag_time(rec, receive, stamps)
    if bag_time is None:
        return {"available": False, "reason": source}
    ms = (bag_time - stamps) / 1e6
    result = {"available": True, "source": source, "count": len(ms),
              **{f"p{q}_ms": percentile(ms, q / 100) for q in (50, 90, 99)},
              "mean_ms": float(ms.mean()), "max_ms": float(ms.max()), "min_ms": float(ms.min()),
              "negative_count": int((ms < 0).sum())}
    if result["negative_count"]:
        result["warning"] = (
            f"{result['negative_count']} of {len(ms)} chunks seem to arrive before their camera frame (down to "
            f"{result['min_ms']:.1f} ms), which is impossible: the receive times are off (via {source}; under load "
            "the recorded /clock lags the replay), so these latencies are not trustworthy")
    return result


def narration_timeline(rec: Recording) -> list[dict]:
    """One entry per request: first/last message times relative to the first recorded message, final text."""
    start = min((t[0] for t in rec.log_times.values()), default=0)
    requests: dict[int, dict] = {}
    for n in rec.narration:
        entry = requests.setdefault(n["request_id"], {"request_id": n["request_id"], "frame_stamp_ns": n["stamp_ns"],
                                                      "first_s": (n["receive_ns"] - start) / 1e9, "messages": 0})
        entry.update(last_s=(n["receive_ns"] - start) / 1e9, text=n["text"], num_tokens=n["num_tokens"],
                     final=n["final"])
        entry["messages"] += 1
    return sorted(requests.values(), key=lambda e: e["first_s"])


@dataclass
class RecordedActions:
    stamps_ns: np.ndarray  # (T,)
    actions: np.ndarray  # (T, A)
    joint_names: list[str]

    @property
    def step_ns(self) -> int:
        """The episode's frame interval (median), by which a recorded action leads the time it targets."""
        return int(np.median(np.diff(self.stamps_ns))) if len(self.stamps_ns) > 1 else 0


def action_error(rec: Recording, recorded: RecordedActions) -> dict:
    """Mean absolute error of every chunk point against the recorded action it targets (see module docstring),
    per joint by name and overall, in the robot's units; points past the episode's end are left out."""
    names = recorded.joint_names or [f"joint {j}" for j in range(recorded.actions.shape[1])]
    target_ns = (recorded.stamps_ns + recorded.step_ns).astype(np.float64)
    sums, counts = np.zeros(len(names)), np.zeros(len(names), dtype=np.int64)
    for chunk in rec.chunks:
        times = chunk["stamp_ns"] + chunk["times_s"] * 1e9
        inside = (times >= target_ns[0]) & (times <= target_ns[-1])
        for j, name in enumerate(names):
            if name not in chunk["joint_names"] or not inside.any():
                continue
            wanted = np.interp(times[inside], target_ns, recorded.actions[:, j])
            sums[j] += np.abs(chunk["positions"][inside, chunk["joint_names"].index(name)] - wanted).sum()
            counts[j] += int(inside.sum())
    if not counts.any():
        return {"available": False, "reason": "no chunk point lies within the episode or no joint name matches"}
    per_joint = {name: float(sums[j] / counts[j]) for j, name in enumerate(names) if counts[j]}
    return {"available": True, "mean_abs": float(sums.sum() / counts.sum()), "points": int(counts.max()),
            "per_joint": per_joint}


def caption_accuracy(narration: list[dict], recorded: RecordedActions) -> dict:
    """Finished narrations whose text equals the caption of the frame they were conditioned on; each scored entry
    of `narration` gets that caption as `expected`, for the report to print beside it."""
    try:
        captions = frame_captions(recorded.actions)
    except ValueError as err:
        return {"available": False, "reason": str(err)}
    frame_of = {int(stamp): k for k, stamp in enumerate(recorded.stamps_ns)}
    scored = [(entry, captions[frame_of[entry["frame_stamp_ns"]]]) for entry in narration
              if entry["final"] and entry["frame_stamp_ns"] in frame_of]
    if not scored:
        return {"available": False, "reason": "no finished narration is stamped with a frame of the episode"}
    matches = sum(entry["text"].strip() == caption for entry, caption in scored)
    for entry, caption in scored:
        entry["expected"] = caption
    return {"available": True, "matches": matches, "scored": len(scored), "accuracy": matches / len(scored)}


def actions_from_episode_bag(bag: str | os.PathLike,
                              on_incomplete: Callable[[str], None] | None = None) -> RecordedActions:
    msgs = [m for _, m in read_messages(bag, [ACTION_TOPIC], on_incomplete)]
    if not msgs:
        raise DataError(f"{bag}: no messages on {ACTION_TOPIC}")
    return RecordedActions(np.array([stamp_to_ns(m.header.stamp) for m in msgs]),
                           np.stack([np.asarray(m.position) for m in msgs]), list(msgs[0].name))


def actions_from_source(src: str, index: int, base_time_ns: int) -> RecordedActions:
    path = Path(src)
    if (path / "meta" / "info.json").exists():
        episode = read_lerobot(path, index)
    else:
        episode = read_aloha(aloha_episode_path(path, index))
    stamps = base_time_ns + np.round(episode.times() * 1e9).astype(np.int64)
    names = list(episode.joint_names) if episode.actions.shape[1] == len(episode.joint_names) else []
    return RecordedActions(stamps, episode.actions.astype(np.float64), names)


def plot_actions(rec: Recording, recorded: RecordedActions | None, path: Path, max_joints: int = 14,
                 random_weights: bool = False) -> None:
    """Per joint: the episode's recorded action (black) and every chunk's trajectory (colour = when the chunk's
    camera frame was taken, with a colour bar); a visible mark when the model had random weights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    names = recorded.joint_names if recorded and recorded.joint_names else (
        rec.chunks[0]["joint_names"] if rec.chunks else [])
    dim = recorded.actions.shape[1] if recorded else (rec.chunks[0]["positions"].shape[1] if rec.chunks else 0)
    dim = max(1, min(dim, max_joints))
    t0 = recorded.stamps_ns[0] if recorded else (rec.chunks[0]["stamp_ns"] if rec.chunks else 0)
    cols = 2 if dim > 1 else 1
    rows = (dim + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols + 1.2, 1.8 * rows + 1.4), squeeze=False, sharex=True)
    chunk_s = np.array([(chunk["stamp_ns"] - t0) / 1e9 for chunk in rec.chunks])
    norm = plt.Normalize(chunk_s.min(), max(chunk_s.max(), chunk_s.min() + 1e-9)) if len(chunk_s) else plt.Normalize(0, 1)
    cmap = plt.cm.viridis
    for j in range(dim):
        ax = axes[j // cols][j % cols]
        name = names[j] if j < len(names) else f"joint {j}"
        for c, chunk in enumerate(rec.chunks):
            column = chunk["joint_names"].index(name) if name in chunk["joint_names"] else j
            if column < chunk["positions"].shape[1]:
                t = chunk_s[c] + chunk["times_s"]
                ax.plot(t, chunk["positions"][:, column], color=cmap(norm(chunk_s[c])), lw=0.8, alpha=0.6)
        if recorded is not None:
            ax.plot((recorded.stamps_ns + recorded.step_ns - t0) / 1e9, recorded.actions[:, j], color="black", lw=1.4)
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=7)
    for j in range(dim, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.supxlabel("episode time [s]", fontsize=9)
    fig.supylabel("commanded position [rad; grippers normalized 0 closed - 1 open]", fontsize=9)
    handles = [Line2D([], [], color=cmap(0.6), lw=1.2, label=f"action chunks ({len(rec.chunks)})")]
    if recorded is not None:
        handles.insert(0, Line2D([], [], color="black", lw=1.4, label="recorded actions (episode)"))
    fig.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    title = f"{len(rec.chunks)} action chunks" + (" vs recorded actions" if recorded is not None else "")
    if random_weights:
        title += "\nRANDOM WEIGHTS: the chunks show the plumbing, not a learned policy"
    fig.suptitle(title, fontsize=10, color="firebrick" if random_weights else "black")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.03, pad=0.02)
    bar.set_label("chunk's camera frame time [s]", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(bag: str | os.PathLike, out: str | os.PathLike, recorded: RecordedActions | None,
                 on_incomplete: Callable[[str], None] | None = None, random_weights: bool = False) -> dict:
    """Read `bag`, then write the report files into `out` (a new folder appears only once complete)."""
    rec = load_recording(bag, on_incomplete)
    report = {"bag": str(bag), "topics": topic_rates(rec), "action_latency": action_latency(rec),
              "action_chunks": len(rec.chunks), "narration": narration_timeline(rec),
              "random_weights": random_weights}
    if recorded is not None:
        report["action_error"] = action_error(rec, recorded)
        report["caption_accuracy"] = caption_accuracy(report["narration"], recorded)
    with output_folder(out) as folder:
        plot_actions(rec, recorded, folder / "actions.png", random_weights=random_weights)
        (folder / "report.json").write_text(json.dumps(report, indent=2))
        (folder / "report.md").write_text(_markdown(report))
    return report


def printable(text: str) -> str:
    """`text` with control and format characters (newlines, escapes, bidi marks...) shown as `\\uXXXX` escapes."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cc", "Cf") else c for c in text)


def _markdown(report: dict) -> str:
    lines = [f"# Run report: {report['bag']}", ""]
    if report.get("random_weights"):
        lines += ["**The model had random weights:** its actions and narration are meaningless; the report shows "
                  "the plumbing, rates and latency.", ""]
    lines += ["| topic | messages | rate (Hz) |", "|---|---|---|"]
    for topic, r in report["topics"].items():
        rate = f"{r['rate_hz']:.1f}" if r["rate_hz"] else "-"
        lines.append(f"| {topic} | {r['count']} | {rate} |")
    lat = report["action_latency"]
    lines += ["", "## Action latency (frame stamp -> chunk received)", ""]
    if lat["available"]:
        lines.append(f"{lat['count']} chunks, p50 {lat['p50_ms']:.1f} ms, p90 {lat['p90_ms']:.1f} ms, "
                     f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms (via {lat['source']})")
        if lat.get("warning"):
            lines += ["", f"**Warning:** {lat['warning']}."]
    else:
        lines.append(f"unavailable: {lat['reason']}")
    error = report.get("action_error")
    if error is not None:
        lines += ["", "## Action error (chunk points vs the recorded actions they target, robot units)", ""]
        if error["available"]:
            lines += [f"mean absolute error {error['mean_abs']:.4f} over {error['points']} points per joint", "",
                      "| joint | mean abs error |", "|---|---|"]
            lines += [f"| {name} | {value:.4f} |" for name, value in error["per_joint"].items()]
        else:
            lines.append(f"unavailable: {error['reason']}")
    captions = report.get("caption_accuracy")
    lines += ["", "## Narration", ""]
    if captions is not None:
        lines += [f"{captions['matches']} of {captions['scored']} finished narrations equal their frame's caption "
                  f"({captions['accuracy']:.0%})" if captions["available"] else f"captions: {captions['reason']}", ""]
    for n in report["narration"]:
        expected = f" (frame caption: {n['expected']})" if "expected" in n else ""
        lines.append(f"- {n['first_s']:.2f}-{n['last_s']:.2f} s, request {n['request_id']}, {n['num_tokens']} tokens"
                     f"{'' if n['final'] else ' (unfinished)'}: {printable(n['text'])}{expected}")
    lines += ["", "![actions](actions.png)", ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("report", __doc__)
    parser.add_argument("bag", help="recorded rosbag2 of the node's outputs")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--episode-bag", help="the episode bag that was replayed (has episode/action)")
    source.add_argument("--episode", metavar="SRC", help="ALOHA .hdf5 / folder or LeRobot v3 dataset")
    parser.add_argument("--episode-index", type=int, default=0, help="episode within SRC")
    parser.add_argument("--base-time", type=base_time_seconds, default=DEFAULT_BASE_TIME_NS / 1e9,
                        help="stamp of SRC's first frame (as given to convert)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--allow-partial", action="store_true",
                        help="report on a damaged bag's readable messages (warning) instead of refusing it")
    parser.add_argument("--random-weights", action="store_true",
                        help="mark the plot and report: the node ran a model with random weights")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warn = (lambda problem: print(f"warning: {problem}", file=sys.stderr)) if args.allow_partial else None
    try:
        recorded = None
        if args.episode_bag:
            recorded = actions_from_episode_bag(args.episode_bag, warn)
        elif args.episode:
            recorded = actions_from_source(args.episode, args.episode_index, int(round(args.base_time * 1e9)))
        report = write_report(args.bag, args.out, recorded, warn, random_weights=args.random_weights)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    lat = report["action_latency"]
    summary = f"p50 {lat['p50_ms']:.1f} ms" if lat["available"] else lat["reason"]
    print(f"wrote {args.out}: {report['action_chunks']} chunks, latency {summary}")
    if lat.get("warning"):
        print(f"warning: {lat['warning']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
