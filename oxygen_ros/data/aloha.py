"""ALOHA / ACT episode files (`episode_{i}.hdf5`), read and written in the layout their recording tools use.

Layout: root attrs `sim` and `compress`; `/observations/images/<cam>` either raw (T, H, W, 3) uint8 with
chunks (1, H, W, 3), or JPEG bytes zero-padded to (T, max_len) uint8 with `/compress_len` (n_cams, T) giving each
frame's true length; `/observations/qpos`, `qvel`, optional
`effort`, and `/action`, all (T, D) float32. The files carry no timestamps or task text: the rate is a fixed
50 Hz and the instruction is supplied by the caller.

The rows of `/compress_len` follow the recording config's camera order, which the file does not store (HDF5
lists group members alphabetically), so the reader matches each camera to the row whose lengths end every frame
exactly on a JPEG end-of-image marker.

Every object is checked for kind (group or dataset), element type and rank before it is read, so a file of
another layout fails with one line naming the object, never with an exception from deep inside h5py or numpy.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from .atomic import atomic_output
from .episode import ALOHA_JOINT_NAMES, DataError, Episode, default_joint_names
from .jpeg import DEFAULT_QUALITY, decode_image, encode_jpeg

ALOHA_FPS = 50.0


def aloha_episode_path(src: str | os.PathLike, episode: int | None) -> Path:
    """Resolve SRC to one file: SRC itself if it is a file, else `SRC/episode_{N}.hdf5` (N defaults to 0)."""
    src = Path(src)
    if src.is_dir():
        path = src / f"episode_{0 if episode is None else episode}.hdf5"
        if not path.exists():
            found = sorted(p.name for p in src.glob("episode_*.hdf5"))
            raise DataError(f"{path}: no such episode file (found {found or 'none'})")
        return path
    if not src.exists():
        raise DataError(f"{src}: no such file")
    if episode not in (None, 0):
        raise DataError(f"{src}: an ALOHA file holds one episode; --episode {episode} is out of range")
    return src


def _array(f: h5py.File, name: str, path: Path, ndim: int, required: bool = True) -> np.ndarray | None:
    """The numeric dataset `name` of rank `ndim` read into memory (None if optional and absent)."""
    obj = f.get(name)
    if obj is None:
        if required:
            raise DataError(f"{path}: missing dataset {name}")
        return None
    if not isinstance(obj, h5py.Dataset):
        raise DataError(f"{path}: {name} is a {type(obj).__name__.lower()}, expected a dataset")
    if obj.dtype.kind not in "biuf":
        raise DataError(f"{path}: {name} holds {obj.dtype} values, expected numbers")
    if obj.ndim != ndim:
        raise DataError(f"{path}: {name} has shape {obj.shape}, expected {ndim} dimensions")
    return obj[()]


def _flag(f: h5py.File, name: str, path: Path) -> bool:
    value = f.attrs.get(name, False)
    if not isinstance(value, bool | np.bool_ | int | np.integer):
        raise DataError(f"{path}: attribute {name!r} is {value!r}, expected a boolean")
    return bool(value)


def read_aloha(path: str | os.PathLike, task: str = "", fps: float = ALOHA_FPS) -> Episode:
    """Read one ALOHA HDF5 episode (raw or JPEG-compressed images)."""
    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path}: not a readable HDF5 file ({err})") from err
    try:
        with f:
            return _read_open_file(f, path, task, fps)
    except (OSError, KeyError) as err:  # corrupt chunks surface only when the data is read
        raise DataError(f"{path}: corrupt HDF5 data ({err})") from err


def _read_open_file(f: h5py.File, path: Path, task: str, fps: float) -> Episode:
    if not isinstance(f.get("/observations"), h5py.Group):
        raise DataError(f"{path}: missing group /observations")
    qpos = _array(f, "/observations/qpos", path, ndim=2)
    if len(qpos) == 0:
        raise DataError(f"{path}: the episode has no frames")
    action = _array(f, "/action", path, ndim=2)
    qvel = _array(f, "/observations/qvel", path, ndim=2, required=False)
    effort = _array(f, "/observations/effort", path, ndim=2, required=False)
    reward = _array(f, "/reward", path, ndim=1, required=False)
    max_reward = float(f["/reward"].attrs["max_reward"]) if reward is not None and "max_reward" in f["/reward"].attrs \
        else None
    group = f.get("/observations/images")
    if not isinstance(group, h5py.Group) or len(group) == 0:
        raise DataError(f"{path}: missing group /observations/images (or it has no cameras)")
    compressed = _flag(f, "compress", path)
    if compressed:
        lengths = _array(f, "/compress_len", path, ndim=2)
        if lengths.shape[0] != len(group):
            raise DataError(f"{path}: /compress_len has {lengths.shape[0]} rows for {len(group)} cameras")
    images = {cam: _array(f, f"/observations/images/{cam}", path, ndim=2 if compressed else 4) for cam in group}
    if compressed:
        rows = _match_compress_rows(images, lengths, path)
        images = {cam: _decode_camera(data, lengths[rows[cam]], path, cam) for cam, data in images.items()}
    names = ALOHA_JOINT_NAMES if qpos.shape[-1] == len(ALOHA_JOINT_NAMES) else default_joint_names(qpos.shape[-1])
    try:
        return Episode(images=images, state=qpos, actions=action, fps=fps, task=task, joint_names=names,
                       velocity=qvel, effort=effort, reward=reward, max_reward=max_reward)
    except DataError as err:
        raise DataError(f"{path}: {err}") from err


def _match_compress_rows(padded: dict[str, np.ndarray], lengths: np.ndarray, path: Path) -> dict[str, int]:
    """Map camera -> row of compress_len: the row whose lengths put an FF D9 marker at every frame's end."""
    rows = {}
    for cam, data in padded.items():
        if data.ndim != 2 or lengths.shape[1] != data.shape[0]:
            raise DataError(f"{path}: camera {cam!r} compressed data {data.shape} does not match compress_len")
        fits = []
        for row, n in enumerate(lengths.astype(np.int64)):
            if np.any(n < 2) or np.any(n > data.shape[1]):
                continue
            t = np.arange(len(n))
            if np.all(data[t, n - 2] == 0xFF) and np.all(data[t, n - 1] == 0xD9):
                fits.append(row)
        free = [r for r in fits if r not in rows.values()]
        if not free:
            raise DataError(f"{path}: no /compress_len row matches camera {cam!r}'s JPEG frames")
        rows[cam] = free[0]
    return rows


def _decode_camera(padded: np.ndarray, lengths: np.ndarray, path: Path, cam: str) -> np.ndarray:
    frames = []
    for t, (row, n) in enumerate(zip(padded, lengths.astype(np.int64))):
        try:
            frames.append(decode_image(row[:n].tobytes()))
        except ValueError as err:
            raise DataError(f"{path}: camera {cam!r} frame {t}: {err}") from err
    return np.stack(frames)


def write_aloha(path: str | os.PathLike, episode: Episode, compress: bool = False, sim: bool = False,
                jpeg_quality: int = DEFAULT_QUALITY) -> Path:
    """Write `episode` as an ALOHA HDF5 file; `compress` stores JPEG frames as the ALOHA tools do.

    qvel is required by the layout; an episode without velocities gets zeros. Effort is written only when
    present (ALOHA's sim files have none). The file appears at `path` only once fully written.
    """
    final = Path(path)
    with atomic_output(final) as tmp:
        with h5py.File(tmp, "w", rdcc_nbytes=1024**2 * 2) as f:
            f.attrs["sim"] = sim
            f.attrs["compress"] = compress
            obs = f.create_group("observations")
            images = obs.create_group("images", track_order=True)
            if compress:
                _write_compressed(f, images, episode, jpeg_quality)
            else:
                for cam, frames in episode.images.items():
                    images.create_dataset(cam, data=frames, dtype="uint8", chunks=(1, *frames.shape[1:]))
            velocity = episode.velocity if episode.velocity is not None else np.zeros_like(episode.state)
            obs.create_dataset("qpos", data=episode.state.astype(np.float32))
            obs.create_dataset("qvel", data=np.asarray(velocity, dtype=np.float32))
            if episode.effort is not None:
                obs.create_dataset("effort", data=np.asarray(episode.effort, dtype=np.float32))
            f.create_dataset("action", data=episode.actions.astype(np.float32))
            if episode.reward is not None:
                reward = f.create_dataset("reward", data=np.asarray(episode.reward, dtype=np.float32))
                if episode.max_reward is not None:
                    reward.attrs["max_reward"] = episode.max_reward
    return final


def _write_compressed(f: h5py.File, images: h5py.Group, episode: Episode, quality: int) -> None:
    encoded = {cam: [encode_jpeg(frame, quality) for frame in frames] for cam, frames in episode.images.items()}
    max_len = max(len(b) for frames in encoded.values() for b in frames)
    lengths = np.zeros((len(encoded), episode.length), dtype=np.float32)  # the tools' default dtype
    for cam_index, (cam, frames) in enumerate(encoded.items()):
        padded = np.zeros((episode.length, max_len), dtype=np.uint8)
        for t, data in enumerate(frames):
            padded[t, : len(data)] = np.frombuffer(data, dtype=np.uint8)
            lengths[cam_index, t] = len(data)
        images.create_dataset(cam, data=padded, dtype="uint8", chunks=(1, max_len))
    f.create_dataset("compress_len", data=lengths)
