"""MP4 encode/decode with PyAV for LeRobot's video features (many episodes back to back in one file).

Frames are stamped pts = frame number in a 1/fps time base, so an episode's frames are found by time
(`from_timestamp` + frame time) as LeRobot does, independent of codec delay or B-frame reordering.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from .episode import DataError

# Preferred encoders per codec name in LeRobot's info.json; the first one this PyAV build has is used.
_ENCODERS = {"h264": ("libx264", "h264"), "av1": ("libsvtav1", "libaom-av1", "av1"), "mpeg4": ("mpeg4",)}


def available_encoder(codec: str) -> str:
    """Name of an FFmpeg encoder for `codec` ("h264", "av1", "mpeg4") in this PyAV build."""
    for name in _ENCODERS.get(codec, (codec,)):
        try:
            av.codec.Codec(name, "w")
            return name
        except (av.error.FFmpegError, ValueError):
            continue
    raise DataError(f"no encoder for {codec!r} in this PyAV build")


def encode_video(path: str | os.PathLike, frames: np.ndarray, fps: float, codec: str = "h264") -> str:
    """Write (N, H, W, 3) uint8 frames to an MP4; returns the codec name as LeRobot records it."""
    encoder = available_encoder(codec)
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(encoder, rate=rate)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if encoder == "libx264":
            stream.options = {"crf": "18", "preset": "veryfast"}
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = i
            frame.time_base = 1 / rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return codec


def decode_video(path: str | os.PathLike, start_s: float, count: int, fps: float) -> np.ndarray:
    """Decode `count` frames starting at time `start_s` (seconds into the file) as (count, H, W, 3) uint8.

    Frames are matched to the expected times `start_s + i / fps` to within half a frame; a missing frame or an
    undecodable file raises DataError naming the file.
    """
    path = Path(path)
    wanted = {int(round((start_s + i / fps) * fps)): i for i in range(count)}
    out: list[np.ndarray | None] = [None] * count
    try:
        with av.open(str(path), "r") as container:
            if not container.streams.video:
                raise DataError(f"{path}: no video stream")
            stream = container.streams.video[0]
            if start_s > 0 and stream.time_base:
                container.seek(int(start_s / stream.time_base), stream=stream, backward=True, any_frame=False)
            last = max(wanted)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                index = int(round(float(frame.pts * frame.time_base) * fps))
                if index in wanted:
                    out[wanted[index]] = frame.to_ndarray(format="rgb24")
                if index >= last:
                    break
    except av.error.FFmpegError as err:
        raise DataError(f"{path}: cannot decode video ({err})") from err
    missing = [i for i, f in enumerate(out) if f is None]
    if missing:
        raise DataError(f"{path}: {len(missing)} of {count} frames missing from {start_s:.3f}s (first: #{missing[0]})")
    return np.stack(out)
