"""JPEG encode/decode for ALOHA's compressed HDF5 layout and for CompressedImage bag messages.

Pillow is used because it round-trips RGB without a colour-order flip; ALOHA's tools used OpenCV with quality 50,
which is the default here so file sizes are comparable.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

DEFAULT_QUALITY = 50


def encode_jpeg(rgb: np.ndarray, quality: int = DEFAULT_QUALITY) -> bytes:
    """(H, W, 3) uint8 RGB -> JPEG bytes."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def decode_image(data: bytes) -> np.ndarray:
    """JPEG (or any still-image format Pillow reads, e.g. PNG) bytes -> (H, W, 3) uint8 RGB.

    Raises ValueError on corrupt data.
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))
    except OSError as err:  # PIL reports truncated/corrupt images as OSError subclasses
        raise ValueError(f"corrupt image data: {err}") from err
