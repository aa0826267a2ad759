"""An openpi observation dict -> what the engine takes, read the way openpi's policy for the robot reads it.

The keys come from the embodiment profile's `openpi_keys` (docs/embodiments.md): the state is the named keys
concatenated in order (a scalar counts as one value, as DROID's gripper), the images are the named keys (a key
``a/b`` is the flat key ``"a/b"`` or ``obs["a"]["b"]``, so both DROID's flat keys and ALOHA's nested ``images``
dict read), in the profile's layout (`hwc`: height-width-channel, or channel first when the first dim is 3;
`chw`: channel first), uint8 or float in [0, 1] (made uint8 as openpi does, ``(255 * x).astype(uint8)``), at any
size within the pixel budget (the engine resizes with padding, as the nodes' frames). Keys the profile does not
name are ignored, as openpi's input transforms ignore them. A missing prompt takes the default prompt, if the server
has one.

Extensions openpi's policies do not read, all optional: ``narrate`` (bool: this frame also starts a narration),
``newest_narration`` (bool: the reply carries this client's newest finished narration), ``noise`` ([horizon,
action_dim] or [1, horizon, action_dim] floats: the flow-matching noise, as openpi's ``Policy.infer(obs, noise=)``
takes it, for a repeatable answer), and real-time chunking's ``rtc_executed`` and ``rtc_delay`` (whole numbers,
given together: how many actions of this connection's previous reply the robot had executed when this observation
was taken, and how many more it will execute before this reply's actions take over; the server guides the new chunk
toward the rest of the previous one, `docs/serve.md`).

Everything a request can get wrong is a `RequestError` with a short reason (a counter name) and a message for the
client of at most `MAX_ERROR_CHARS` characters (a refused value is described, never echoed whole); nothing here
raises anything else on any input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..control.embodiment import Embodiment, OpenpiKeys
from ..model.preprocess import Observation
from .protocol import preview

PROMPT_KEY = "prompt"
MAX_PROMPT_CHARS = 65536  # far beyond any model's prompt; bounds the tokenizer's work on a hostile request
MAX_STATE_VALUES = 1024  # far beyond any model's state (pi05's: 32); refused before any conversion
MAX_ERROR_CHARS = 500  # of the message a refused request gets (and the log line that names it)
_MISSING = object()


class RequestError(ValueError):
    """A request the server refuses: `reason` names the kind (counted and logged once per client), the text is
    what the client is told."""

    def __init__(self, reason: str, message: str):
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS - 3] + "..."
        super().__init__(message)
        self.reason = reason


@dataclass
class OpenpiRequest:
    observation: Observation  # model image key -> HxWx3 uint8, the model's (unnormalized) state, the prompt
    state: np.ndarray  # the robot state as sent, in robot units: the frame's state the actions are relative to
    narrate: bool
    newest_narration: bool
    noise: np.ndarray | None  # [1, horizon, action_dim] float32
    rtc: tuple[int, int] | None = None  # (rtc_executed, rtc_delay): real-time chunking asked for


def lookup(obs: dict, key: str) -> Any:
    """`obs[key]`, or the nested `obs[a][b]` for key ``a/b``; _MISSING when neither exists."""
    if key in obs:
        return obs[key]
    value: Any = obs
    for part in key.split("/"):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


class RequestReader:
    """Reads requests for one embodiment and model: `noise_shape` (horizon, action_dim) is the model's,
    `max_pixels` the budget per image (0: none), `default_prompt` the prompt of a request without one ("": none)."""

    def __init__(self, embodiment: Embodiment, noise_shape: tuple[int, int], max_pixels: int, default_prompt: str):
        if embodiment.openpi_keys is None:
            raise ValueError(f"embodiment {embodiment.name} has no openpi_keys section: it does not say which "
                             "observation keys an openpi client sends (docs/embodiments.md)")
        self.embodiment = embodiment
        self.keys: OpenpiKeys = embodiment.openpi_keys
        self.noise_shape = noise_shape
        self.max_pixels = max_pixels
        self.default_prompt = default_prompt

    def read(self, obs: Any) -> OpenpiRequest:
        if not isinstance(obs, dict):
            raise RequestError("not_a_dict", f"a request must be a dict of observation keys, got "
                                             f"{type(obs).__name__}")
        state = self._state(obs)
        images = {model_key: self._image(obs, key) for key, model_key in self.keys.images
                  if key not in self.keys.optional_images or lookup(obs, key) is not _MISSING}
        observation = Observation(images, self.embodiment.state_to_model(state), self._prompt(obs))
        return OpenpiRequest(observation, state, self._flag(obs, "narrate"), self._flag(obs, "newest_narration"),
                             self._noise(obs), self._rtc(obs))

    def _missing(self, key: str) -> RequestError:
        names = [k for k, _ in self.keys.state] + [k for k, _ in self.keys.images
                                                   if k not in self.keys.optional_images]
        return RequestError("missing_key", f"missing key {key!r}: embodiment {self.embodiment.name} reads "
                                           f"{', '.join(names)} and {PROMPT_KEY}")

    def _state(self, obs: dict) -> np.ndarray:
        parts = []
        for key, width in self.keys.state:
            value = lookup(obs, key)
            if value is _MISSING:
                raise self._missing(key)
            array = _numbers(key, value)
            if width is not None and array.size != width:
                raise RequestError("state_shape", f"{key} must hold {width} values, got shape {list(array.shape)}")
            parts.append(array)
        if sum(part.size for part in parts) > MAX_STATE_VALUES:
            raise RequestError("state_shape", f"the state holds {sum(part.size for part in parts)} values, more "
                                              f"than any model reads ({MAX_STATE_VALUES})")
        state = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
        bad = np.flatnonzero(~np.isfinite(state))
        if bad.size:
            raise RequestError("nonfinite_state", f"the state holds NaN or infinite values: {bad.size} of "
                                                  f"{state.size}, the first at index {bad[0]}")
        if self.embodiment.state_dims is not None and state.size != self.embodiment.state_dims:
            raise RequestError("state_shape", f"embodiment {self.embodiment.name} reads {self.embodiment.state_dims}"
                                              f" state values, got {state.size}")
        return state

    def _image(self, obs: dict, key: str) -> np.ndarray:
        value = lookup(obs, key)
        if value is _MISSING:
            raise self._missing(key)
        image = _array(value) if isinstance(value, np.ndarray | list) else None
        if image is None or image.dtype != np.uint8 and image.dtype.kind != "f":
            what = f"dtype {image.dtype}" if image is not None else type(value).__name__
            raise RequestError("image_dtype", f"image {key} must be a uint8 array (or float in [0, 1]), got {what}")
        layout = self.keys.image_layout
        if image.ndim == 3 and image.shape[0] == 3:  # channel first: always in `chw`, openpi's rule in `hwc`
            image = image.transpose(1, 2, 0)
        elif layout == "chw" or image.ndim != 3 or image.shape[2] != 3:
            wanted = "3 x height x width (channel first)" if layout == "chw" else \
                "height x width x 3 (or 3 x height x width)"
            raise RequestError("image_shape", f"image {key} must be {wanted}, got shape {list(image.shape)}")
        height, width = image.shape[:2]
        if not height or not width:
            raise RequestError("image_shape", f"image {key} is empty: shape {list(image.shape)}")
        if self.max_pixels and height * width > self.max_pixels:
            raise RequestError("image_size", f"image {key} has {width} x {height} pixels, more than the server's "
                                             f"budget of {self.max_pixels} (cameras.max_pixels)")
        if image.dtype.kind == "f":
            if not np.isfinite(image).all() or image.min() < 0.0 or image.max() > 1.0:
                raise RequestError("image_values", f"float image {key} must hold values in [0, 1]")
            image = (255 * image).astype(np.uint8)
        return np.array(image, order="C")  # a copy: a received array is a read-only view of the message

    def _prompt(self, obs: dict) -> str:
        value = obs.get(PROMPT_KEY, _MISSING)
        if value is _MISSING:
            if not self.default_prompt:
                raise RequestError("missing_key", f"missing key {PROMPT_KEY!r} (and the server has no default "
                                                  "prompt: instruction.default)")
            return self.default_prompt
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError("prompt", f"{PROMPT_KEY} is not UTF-8 text") from None
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind == "U":
            value = str(value)
        if not isinstance(value, str):
            raise RequestError("prompt", f"{PROMPT_KEY} must be a string, got {type(value).__name__}")
        if len(value) > MAX_PROMPT_CHARS:
            raise RequestError("prompt", f"{PROMPT_KEY} has {len(value)} characters, more than {MAX_PROMPT_CHARS}")
        return value

    def _flag(self, obs: dict, key: str) -> bool:
        value = obs.get(key, False)
        if not isinstance(value, bool | np.bool_):
            raise RequestError("bad_flag", f"{key} must be true or false, got {preview(value)}")
        return bool(value)

    def _rtc(self, obs: dict) -> tuple[int, int] | None:
        """(rtc_executed, rtc_delay), or None when the client asks for no real-time chunking. A value that is not
        a whole number is refused; whether the numbers can be used is the guide's to say (plain sampling)."""
        given = [key for key in ("rtc_executed", "rtc_delay") if obs.get(key) is not None]
        if not given:
            return None
        if len(given) == 1:
            raise RequestError("rtc", "rtc_executed and rtc_delay go together: give both or neither")
        return _whole("rtc_executed", obs["rtc_executed"]), _whole("rtc_delay", obs["rtc_delay"])

    def _noise(self, obs: dict) -> np.ndarray | None:
        value = obs.get("noise")
        if value is None:
            return None
        shape = self.noise_shape
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.shape not in (shape, (1, *shape)):
            what = f"shape {list(value.shape)} dtype {value.dtype}" if isinstance(value, np.ndarray) else \
                type(value).__name__
            raise RequestError("noise", f"noise must be a float array of shape {list(shape)} (the model's horizon "
                                        f"and action dims), got {what}")
        if not np.isfinite(value).all():
            raise RequestError("noise", "noise holds NaN or infinite values")
        return value.reshape(1, *shape).astype(np.float32)


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise RequestError("rtc", f"{key} must be a whole number, got {preview(value)}")
    return int(value)


def _numbers(key: str, value: Any) -> np.ndarray:
    """A state part: numbers (a scalar counts as one value), flat, in the dtype they came in (converted once the
    width is known to be sane)."""
    array = _array(value) if isinstance(value, np.ndarray | np.generic | list | int | float) \
        and not isinstance(value, bool) else None
    if array is not None and array.dtype.kind in "iuf":
        return array.reshape(-1)
    what = f"dtype {array.dtype}" if array is not None else type(value).__name__
    raise RequestError("state_dtype", f"{key} must hold numbers, got {what}")


def _array(value: Any) -> np.ndarray | None:
    """`value` as an array; None for a ragged list or one numpy cannot hold."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        return None
