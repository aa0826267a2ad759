"""LeRobot dataset v3.0 (the layout ALOHA and DROID are published in), read and written with pyarrow + PyAV; v2.x
(what openpi's conversion scripts write, its DROID data included) is read too.

v3.0 packs many episodes per file: frames live in `data/chunk-XXX/file-XXX.parquet`, camera streams in
`videos/<key>/chunk-XXX/file-XXX.mp4`, and `meta/episodes/...parquet` says where each episode sits (row range,
video time range). Only the fields LeRobot's own loader needs are written; stats cover min/max/mean/std/count.

v2.x keeps one file per episode: `data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet`, videos at
`videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4` (the info.json templates; the chunk
is the episode index // `chunks_size`), episodes and tasks in `meta/episodes.jsonl` / `meta/tasks.jsonl`.

Feature keys: `observation.state` (or DROID's `observation.state.joint_position` + `.gripper_position`, or
openpi's DROID conversion's `joint_position` + `gripper_position`), `action` (or DROID's `action.joint_position` +
`action.gripper_position`, or openpi's `actions`), `observation.images.<camera>` (video or image; in a v2.x
dataset any image or video feature, openpi's DROID `exterior_image_1_left` say), optional `observation.velocity`
/ `observation.effort` / `observation.environment_state` (a simulator's object poses).

The reader checks the types of everything it uses (info.json entries, episode metadata fields, column types and
row widths) before using it, so a dataset of another shape fails with one line naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .atomic import atomic_output
from .episode import DataError, Episode
from .jpeg import decode_image
from .video import decode_video, encode_video

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
IMAGE_PREFIX = "observation.images."
STATE_KEYS = ("observation.state",)
ENVIRONMENT_KEY = "observation.environment_state"  # LeRobot's name for the scene's state beside the robot's
DROID_STATE_PARTS = ("observation.state.joint_position", "observation.state.gripper_position")
DROID_ACTION_PARTS = ("action.joint_position", "action.gripper_position")
# openpi's examples/droid/convert_droid_data_to_lerobot.py (and its other conversions): keys without a prefix.
OPENPI_STATE_PARTS = ("joint_position", "gripper_position")
OPENPI_ACTION_KEY = "actions"
V2_CHUNKS_SIZE = 1000  # LeRobot v2's default chunks_size
_INDEX_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


# ----------------------------------------------------------------------------------------------- reading


def lerobot_info(root: str | os.PathLike, versions: tuple[str, ...] = ("v3.",)) -> dict:
    """meta/info.json, checked to be a dataset of one of `versions` with a positive fps and a features mapping."""
    path = Path(root) / "meta" / "info.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise DataError(f"{path}: missing (not a LeRobot dataset)") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: invalid JSON ({err})") from err
    if not isinstance(info, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(info).__name__}")
    version = str(info.get("codebase_version", ""))
    if not version.startswith(versions):
        wanted = " or ".join(f"{v}x" for v in versions)
        raise DataError(f"{path}: codebase_version {version!r} is not {wanted} (other layouts are not supported)")
    for key in ("fps", "features"):
        if key not in info:
            raise DataError(f"{path}: no {key!r} entry")
    fps = info["fps"]
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not math.isfinite(fps) or fps <= 0:
        raise DataError(f"{path}: fps must be a positive number, got {fps!r}")
    features = info["features"]
    if not isinstance(features, dict) or not all(isinstance(v, dict) for v in features.values()):
        raise DataError(f"{path}: 'features' must map each key to an object")
    for key in ("data_path", "video_path"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise DataError(f"{path}: {key!r} must be a path template string, got {info[key]!r}")
    return info


def _field(row: dict, key: str, kind: type | tuple[type, ...], where: str):
    """`row[key]` checked to be of `kind` (bools are not numbers here)."""
    if row.get(key) is None:
        raise DataError(f"{where}: episode metadata has no {key!r} field")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise DataError(f"{where}: episode field {key!r} is {value!r}, expected {getattr(kind, '__name__', kind)}")
    return value


def _fill(template: str, where: str, **fields) -> str:
    """A path template from info.json filled in; placeholders it should not have are named."""
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        raise DataError(f"{where}: path template {template!r} in info.json does not fit ({err!r})") from err


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except FileNotFoundError as err:
        raise DataError(f"{path}: missing") from err
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable parquet file ({err})") from err


def lerobot_episodes(root: str | os.PathLike) -> list[dict]:
    """All rows of meta/episodes/*/*.parquet (stats columns dropped), sorted by episode_index."""
    files = sorted((Path(root) / "meta" / "episodes").glob("*/*.parquet"))
    if not files:
        raise DataError(f"{Path(root) / 'meta' / 'episodes'}: no episode metadata files")
    rows = []
    for path in files:
        table = _read_parquet(path)
        keep = [c for c in table.column_names if not c.startswith("stats/")]
        for row in table.select(keep).to_pylist():
            _field(row, "episode_index", int, str(path))
            rows.append(row)
    return sorted(rows, key=lambda r: r["episode_index"])


def _vector(table: pa.Table, key: str, where: Path) -> np.ndarray:
    """A numeric list column (every row of one width) or scalar column as (N, D) float32."""
    column = table.column(key).combine_chunks()
    values = column
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or pa.types.is_large_list(
        column.type
    ):
        widths = pc.list_value_length(column)
        low, high = pc.min(widths).as_py(), pc.max(widths).as_py()
        if widths.null_count or low != high:
            raise DataError(f"{where}: column {key!r} has rows of different widths ({low} to {high}) or empty rows")
        values = column.flatten()
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise DataError(f"{where}: column {key!r} holds {values.type} values, expected numbers")
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(table), -1)


def _names(feature: dict) -> list[str]:
    names = feature.get("names")
    if isinstance(names, dict):  # older hub datasets: {"motors": [...]} or {"axes": [...]}
        names = [n for group in names.values() if isinstance(group, list) for n in group]
    return [str(n) for n in names] if isinstance(names, list) else []


def _select(table: pa.Table, features: dict, keys: Sequence[str], what: str, where: Path) -> tuple:
    present = [k for k in keys if k in table.column_names]
    if not present:
        raise DataError(f"{where}: no {what} column (looked for {list(keys)})")
    values = np.concatenate([_vector(table, k, where) for k in present], axis=1)
    names = [n for k in present for n in _names(features.get(k, {}))]
    return values, names if len(names) == values.shape[1] else []


def read_lerobot(root: str | os.PathLike, episode: int = 0) -> Episode:
    """Read episode `episode` of a LeRobot v3 or v2.x dataset into an Episode (videos decoded to RGB frames)."""
    root = Path(root)
    info = lerobot_info(root, versions=("v3.", "v2."))
    v2 = str(info["codebase_version"]).startswith("v2.")
    fps = float(info["fps"])
    features = info["features"]
    rows = _v2_episodes(root) if v2 else lerobot_episodes(root)
    meta = next((r for r in rows if r["episode_index"] == episode), None)
    if meta is None:
        raise DataError(f"{root}: episode {episode} out of range (dataset has {len(rows)} episodes)")
    where = f"{root}: episode {episode}"
    length = _field(meta, "length", int, where)
    if length <= 0:
        raise DataError(f"{where}: the episode has no frames")
    if v2:
        data_path = root / _fill(info.get("data_path") or "", where, episode_chunk=_v2_chunk(info, episode, where),
                                 episode_index=episode)
    else:
        data_path = root / _fill(info.get("data_path") or DATA_PATH, where,
                                 chunk_index=_field(meta, "data/chunk_index", int, where),
                                 file_index=_field(meta, "data/file_index", int, where))
    table = _read_parquet(data_path)
    if "episode_index" not in table.column_names:
        raise DataError(f"{data_path}: no episode_index column")
    table = table.filter(pc.equal(table.column("episode_index"), episode))
    if "frame_index" in table.column_names:
        table = table.sort_by("frame_index")
    if len(table) != length:
        raise DataError(f"{data_path}: episode {episode} has {len(table)} frames, metadata says {length}")

    state_keys = [k for k in STATE_KEYS if k in table.column_names] or [
        k for k in DROID_STATE_PARTS if k in table.column_names] or list(OPENPI_STATE_PARTS)
    state, joint_names = _select(table, features, state_keys, "state", data_path)
    action_keys = next(([k] for k in ("action", OPENPI_ACTION_KEY) if k in table.column_names),
                       list(DROID_ACTION_PARTS))
    actions, _ = _select(table, features, action_keys, "action", data_path)
    timestamps = _timestamps(table, fps, data_path)
    images = {}
    for key, feature in features.items():
        if not key.startswith(IMAGE_PREFIX) and not (v2 and feature.get("dtype") in ("image", "video")):
            continue
        camera = key.removeprefix(IMAGE_PREFIX)
        if feature.get("dtype") == "video" and v2:
            path = root / _fill(info.get("video_path") or "", where, episode_chunk=_v2_chunk(info, episode, where),
                                video_key=key, episode_index=episode)
            if not path.exists():
                raise DataError(f"{path}: missing video file")
            images[camera] = decode_video(path, 0.0, length, fps)
        elif feature.get("dtype") == "video":
            images[camera] = _read_video_feature(root, info, meta, key, length, fps)
        elif feature.get("dtype") == "image" and key in table.column_names:
            images[camera] = _read_image_column(table, key, data_path)
    task = _episode_task(root, table, meta)
    try:
        return Episode(
            images=images, state=state, actions=actions, fps=fps, task=task, joint_names=tuple(joint_names),
            timestamps=timestamps,
            velocity=_optional_vector(table, "observation.velocity", data_path),
            effort=_optional_vector(table, "observation.effort", data_path),
            environment_state=_optional_vector(table, ENVIRONMENT_KEY, data_path),
        )
    except DataError as err:
        raise DataError(f"{root}: episode {episode}: {err}") from err


def _v2_episodes(root: Path) -> list[dict]:
    """meta/episodes.jsonl of a v2.x dataset: one object per line with episode_index, tasks and length."""
    path = root / "meta" / "episodes.jsonl"
    rows = []
    for number, line in enumerate(_jsonl(path), start=1):
        _field(line, "episode_index", int, f"{path}:{number}")
        rows.append(line)
    return sorted(rows, key=lambda r: r["episode_index"])


def _v2_chunk(info: dict, episode: int, where: str) -> int:
    size = info.get("chunks_size", V2_CHUNKS_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise DataError(f"{where}: info.json chunks_size must be a positive integer, got {size!r}")
    return episode // size


def _jsonl(path: Path) -> list[dict]:
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError as err:
        raise DataError(f"{path}: missing") from err
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: invalid JSON ({err})") from err
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object")
        rows.append(row)
    return rows


def _optional_vector(table: pa.Table, key: str, where: Path) -> np.ndarray | None:
    return _vector(table, key, where) if key in table.column_names else None


def _timestamps(table: pa.Table, fps: float, where: Path) -> np.ndarray | None:
    """Frame times; None (nominal i / fps) when they match it to LeRobot's 1e-4 s tolerance.

    The column is float32, so even a perfectly regular episode is off by up to ~1e-7 s per frame; snapping
    keeps stamps in converted bags exact instead of a nanosecond off.
    """
    if "timestamp" not in table.column_names:
        return None
    times = _vector(table, "timestamp", where).astype(np.float64)
    if times.shape[1] != 1:
        raise DataError(f"{where}: column 'timestamp' has {times.shape[1]} values per row, expected 1")
    times = times[:, 0]
    nominal = np.arange(len(times)) / fps
    return None if np.allclose(times, nominal, rtol=0, atol=1e-4) else times


def _read_video_feature(root: Path, info: dict, meta: dict, key: str, length: int, fps: float) -> np.ndarray:
    prefix = f"videos/{key}/"
    if prefix + "chunk_index" not in meta:
        raise DataError(f"{root}: episode metadata has no video location for {key!r}")
    where = f"{root}: episode {meta['episode_index']}"
    path = root / _fill(info.get("video_path") or VIDEO_PATH, where, video_key=key,
                        chunk_index=_field(meta, prefix + "chunk_index", int, where),
                        file_index=_field(meta, prefix + "file_index", int, where))
    if not path.exists():
        raise DataError(f"{path}: missing video file")
    return decode_video(path, float(_field(meta, prefix + "from_timestamp", int | float, where)), length, fps)


def _read_image_column(table: pa.Table, key: str, where: Path) -> np.ndarray:
    frames = []
    for i, cell in enumerate(table.column(key).to_pylist()):
        try:
            frames.append(decode_image(cell["bytes"] if isinstance(cell, dict) else cell))
        except (ValueError, TypeError) as err:
            raise DataError(f"{where}: {key} frame {i}: {err}") from err
    return np.stack(frames)


def _episode_task(root: Path, table: pa.Table, meta: dict) -> str:
    listed_v2 = root / "meta" / "tasks.jsonl"
    if listed_v2.exists() and "task_index" in table.column_names and len(table):
        by_index = {row.get("task_index"): row.get("task") for row in _jsonl(listed_v2)}
        task = by_index.get(table.column("task_index")[0].as_py())
        if isinstance(task, str):
            return task
    path = root / "meta" / "tasks.parquet"
    if path.exists() and "task_index" in table.column_names and len(table):
        tasks = _read_parquet(path)
        text_column = "task" if "task" in tasks.column_names else "__index_level_0__"
        if text_column in tasks.column_names and "task_index" in tasks.column_names:
            by_index = dict(zip(tasks.column("task_index").to_pylist(), tasks.column(text_column).to_pylist()))
            task_index = table.column("task_index")[0].as_py()
            if task_index in by_index:
                return str(by_index[task_index])
    listed = meta.get("tasks") or []
    if isinstance(listed, str):
        return listed
    return str(listed[0]) if isinstance(listed, list) and listed else ""


# ----------------------------------------------------------------------------------------------- writing


def _check_compatible(episodes: Sequence[Episode]) -> None:
    if not episodes:
        raise DataError("no episodes to write")
    first = episodes[0]
    for i, ep in enumerate(episodes[1:], 1):
        same = (
            ep.fps == first.fps
            and ep.cameras == first.cameras
            and ep.state.shape[1] == first.state.shape[1]
            and ep.actions.shape[1] == first.actions.shape[1]
            and all(ep.images[c].shape[1:] == first.images[c].shape[1:] for c in first.cameras)
            and (ep.velocity is None) == (first.velocity is None)
            and (ep.effort is None) == (first.effort is None)
            and (ep.environment_state is None) == (first.environment_state is None)
        )
        if not same:
            raise DataError(f"episode {i} differs from episode 0 in fps, cameras, shapes or optional fields")


def _vector_feature(dim: int, names: Sequence[str]) -> dict:
    return {"dtype": "float32", "shape": [dim], "names": list(names)}


def _stats(values: np.ndarray) -> dict:
    return {
        "min": values.min(0).tolist(),
        "max": values.max(0).tolist(),
        "mean": values.mean(0).tolist(),
        "std": values.std(0).tolist(),
        "count": [int(len(values))],
    }


def _image_stats(frames: np.ndarray) -> dict:
    """Per-channel stats in [0, 1], shaped (3, 1, 1) like LeRobot's; every 10th frame is enough."""
    pixels = frames[::10].reshape(-1, 3).astype(np.float32) / 255.0
    stats = _stats(pixels)
    return {k: (np.asarray(v).reshape(3, 1, 1).tolist() if k != "count" else v) for k, v in stats.items()}


def _tasks_table(tasks: list[str]) -> pa.Table:
    """tasks.parquet as pandas writes a DataFrame indexed by task text, so pandas readers get that index."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def write_lerobot(root: str | os.PathLike, episodes: Sequence[Episode], codec: str = "h264",
                  robot_type: str = "unknown", extra_meta: Mapping[str, dict] | None = None) -> Path:
    """Write episodes as a LeRobot v3.0 dataset in one data file and one video file per camera.

    `codec` is "h264" (default), "av1" or "mpeg4"; `extra_meta` maps names to JSON objects written as
    `meta/<name>.json` (how the episodes were made, say; LeRobot's loader ignores such files). The dataset appears
    at `root` only once complete.
    """
    for name in extra_meta or {}:
        if not name.isidentifier() or name in ("info", "stats"):
            raise DataError(f"extra metadata name {name!r} must be a plain name other than info and stats")
    _check_compatible(episodes)
    first = episodes[0]
    fps = first.fps
    tasks = list(dict.fromkeys(ep.task for ep in episodes))
    vectors = {"observation.state": [ep.state for ep in episodes], "action": [ep.actions for ep in episodes]}
    if first.velocity is not None:
        vectors["observation.velocity"] = [np.asarray(ep.velocity, np.float32) for ep in episodes]
    if first.effort is not None:
        vectors["observation.effort"] = [np.asarray(ep.effort, np.float32) for ep in episodes]
    if first.environment_state is not None:
        vectors[ENVIRONMENT_KEY] = [np.asarray(ep.environment_state, np.float32) for ep in episodes]
    lengths = [ep.length for ep in episodes]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    total = int(starts[-1])

    columns: dict[str, pa.Array] = {}
    for key, parts in vectors.items():
        stacked = np.concatenate(parts).astype(np.float32)
        columns[key] = pa.FixedSizeListArray.from_arrays(pa.array(stacked.reshape(-1)), stacked.shape[1])
    columns["timestamp"] = pa.array(np.concatenate([ep.times() for ep in episodes]).astype(np.float32))
    columns["frame_index"] = pa.array(np.concatenate([np.arange(n) for n in lengths]).astype(np.int64))
    columns["episode_index"] = pa.array(np.repeat(np.arange(len(episodes)), lengths).astype(np.int64))
    columns["index"] = pa.array(np.arange(total, dtype=np.int64))
    columns["task_index"] = pa.array(np.repeat([tasks.index(ep.task) for ep in episodes], lengths).astype(np.int64))

    features: dict[str, dict] = {}
    for key, parts in vectors.items():
        names = first.joint_names if parts[0].shape[1] == len(first.joint_names) else ()
        features[key] = _vector_feature(parts[0].shape[1], names or [f"dim_{i}" for i in range(parts[0].shape[1])])
    stats = {key: _stats(np.concatenate(parts)) for key, parts in vectors.items()}

    with atomic_output(root) as out:
        for camera in first.cameras:
            key = IMAGE_PREFIX + camera
            frames = np.concatenate([ep.images[camera] for ep in episodes])
            video = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
            video.parent.mkdir(parents=True)
            codec_name = encode_video(video, frames, fps, codec)
            h, w = frames.shape[1:3]
            features[key] = {
                "dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                "info": {"video.height": h, "video.width": w, "video.codec": codec_name, "video.pix_fmt": "yuv420p",
                         "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False},
            }
            stats[key] = _image_stats(frames)
        features.update(_INDEX_FEATURES)

        data_file = out / DATA_PATH.format(chunk_index=0, file_index=0)
        data_file.parent.mkdir(parents=True)
        pq.write_table(pa.table(columns), data_file)

        episode_rows = []
        for i, ep in enumerate(episodes):
            row = {
                "episode_index": i, "tasks": [ep.task], "length": ep.length,
                "data/chunk_index": 0, "data/file_index": 0,
                "dataset_from_index": int(starts[i]), "dataset_to_index": int(starts[i + 1]),
                "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
            }
            for camera in first.cameras:
                prefix = f"videos/{IMAGE_PREFIX}{camera}/"
                row.update({prefix + "chunk_index": 0, prefix + "file_index": 0,
                            prefix + "from_timestamp": float(starts[i] / fps),
                            prefix + "to_timestamp": float(starts[i + 1] / fps)})
            for key, parts in vectors.items():
                for stat, value in _stats(parts[i]).items():
                    row[f"stats/{key}/{stat}"] = value
            episode_rows.append(row)
        episodes_file = out / EPISODES_PATH.format(chunk_index=0, file_index=0)
        episodes_file.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episode_rows), episodes_file)
        pq.write_table(_tasks_table(tasks), out / "meta" / "tasks.parquet")

        info = {
            "codebase_version": CODEBASE_VERSION, "robot_type": robot_type,
            "total_episodes": len(episodes), "total_frames": total, "total_tasks": len(tasks),
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
            "fps": fps, "splits": {"train": f"0:{len(episodes)}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH if first.cameras else None,
            "features": features,
        }
        (out / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        (out / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
        for name, value in (extra_meta or {}).items():
            (out / "meta" / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n")
    return Path(root)


def dataset_checksums(root: str | os.PathLike) -> dict[str, str]:
    """SHA-256 of every file of a dataset folder, by path relative to it (sorted), and of the whole under "*"
    (each path and its digest in turn): what to compare when two runs should have written the same dataset."""
    root = Path(root)
    sums = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        sums[path.relative_to(root).as_posix()] = digest.hexdigest()
    whole = hashlib.sha256("".join(f"{name} {value}\n" for name, value in sums.items()).encode())
    return {**sums, "*": whole.hexdigest()}
