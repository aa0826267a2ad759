"""The YAML parser of embodiment profiles: a profile's file (docs/embodiments.md has its keys) -> the fields of an
`Embodiment`, every mistake an EmbodimentError naming the key and what it must be."""

from __future__ import annotations

import math
from typing import Any

from .embodiment_math import (
    CONVERSIONS,
    GRIPPER,
    IMAGE_LAYOUTS,
    KINDS,
    REFUSED_KINDS,
    VELOCITY,
    ActionFilter,
    Conversion,
    DimMap,
    EmbodimentError,
    Linear,
    Linkage,
    OpenpiKeys,
    Range,
    VelocityScale,
)

_TOP_KEYS = ("name", "about", "rate_hz", "horizon", "openpi_asset_ids", "state", "action", "velocity", "conversions",
             "openpi_keys")
_STATE_KEYS = ("dims", "pick", "sign", "convert")
_ACTION_KEYS = ("dims", "kinds", "sign", "convert", "clip", "binarize")


def parse_profile(data: Any, source: str) -> dict:
    """A profile's parsed YAML -> the keyword arguments of `Embodiment`."""
    table = _table(data, "the file", _TOP_KEYS)
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise EmbodimentError("name must be a non-empty string")
    rate = table.get("rate_hz")
    if rate is not None and not (_number(rate) and rate > 0):
        raise EmbodimentError(f"rate_hz must be a positive number, got {rate!r}")
    horizon = table.get("horizon")
    if horizon is not None and not (isinstance(horizon, int) and not isinstance(horizon, bool) and horizon > 0):
        raise EmbodimentError(f"horizon must be a positive integer, got {horizon!r}")
    assets = table.get("openpi_asset_ids", [])
    if not isinstance(assets, list) or not all(isinstance(a, str) and a for a in assets):
        raise EmbodimentError(f"openpi_asset_ids must be a list of names, got {assets!r}")
    conversions = {key: _conversion(key, spec) for key, spec in _table(table.get("conversions", {}), "conversions",
                                                                        None).items()}
    used: set[str] = set()
    profile = dict(name=name.strip(), source=source, rate_hz=None if rate is None else float(rate), horizon=horizon,
                   openpi_asset_ids=tuple(assets))
    if "state" in table:
        state = _table(table["state"], "state", _STATE_KEYS)
        dims = _count(state, "state.dims")
        pick = state.get("pick")
        if pick is not None:
            if not isinstance(pick, list) or not pick or not all(_index(p, dims) for p in pick):
                raise EmbodimentError(f"state.pick must list robot state indices in [0, {dims}), got {pick!r}")
            pick = tuple(pick)
        width = len(pick) if pick is not None else dims
        profile.update(state_dims=dims, state_pick=pick,
                       state_map=_dim_map(state, "state", width, conversions, used))
    if "action" in table:
        action = _table(table["action"], "action", _ACTION_KEYS)
        dims = _count(action, "action.dims")
        kinds = action.get("kinds")
        if kinds is None:
            raise EmbodimentError(f"action.kinds is missing: give each of the {dims} action dims its kind "
                                  f"({' | '.join(KINDS)}); the delta and velocity dims are the mask of what is "
                                  "relative to the state")
        if not isinstance(kinds, list) or len(kinds) != dims:
            raise EmbodimentError(f"action.kinds must list one kind for each of the {dims} action dims, got {kinds!r}")
        for kind in kinds:
            if kind in REFUSED_KINDS:
                raise EmbodimentError(f"action kind {kind!r}: {REFUSED_KINDS[kind]}")
            if kind not in KINDS:
                raise EmbodimentError(f"unknown action kind {kind!r}; known: {' | '.join(KINDS)}")
        if VELOCITY in kinds and rate is None:
            raise EmbodimentError("velocity actions need rate_hz (the checkpoint's control rate) to be integrated")
        action_map = _dim_map(action, "action", dims, conversions, used)
        converted = [d for d in action_map.convert if kinds[d] == VELOCITY]
        if converted:
            raise EmbodimentError(f"action dims {converted} are velocities: a unit conversion applies to positions")
        profile.update(kinds=tuple(kinds), action_map=action_map, action_filter=_action_filter(action, kinds))
    if "velocity" in table:
        if VELOCITY not in profile.get("kinds", ()):
            raise EmbodimentError("velocity: the profile has no velocity action dims for it to scale")
        profile["velocity"] = _velocity(table["velocity"])
    unused = sorted(set(conversions) - used)
    if unused:
        raise EmbodimentError(f"conversions {unused} are defined but no dim uses them")
    if "openpi_keys" in table:
        profile["openpi_keys"] = _openpi_keys(table["openpi_keys"], profile.get("state_dims"))
    return profile


def _table(value: Any, what: str, keys: tuple[str, ...] | None) -> dict:
    if not isinstance(value, dict):
        raise EmbodimentError(f"{what} must be a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if keys is not None and k not in keys)
    if unknown:
        raise EmbodimentError(f"{what} has unknown keys {unknown}; known: {', '.join(keys)}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _index(value: Any, dims: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < dims


def _count(table: dict, name: str) -> int:
    dims = table.get(name.split(".")[1])
    if not (isinstance(dims, int) and not isinstance(dims, bool) and dims > 0):
        raise EmbodimentError(f"{name} must be a positive integer, got {dims!r}")
    return dims


def _dim_map(table: dict, side: str, width: int, conversions: dict, used: set[str]) -> DimMap:
    sign = table.get("sign", [1] * width)
    if not isinstance(sign, list) or len(sign) != width or not all(s in (1, -1) for s in sign):
        raise EmbodimentError(f"{side}.sign must list +1 or -1 for each of its {width} model dims, got {sign!r}")
    convert = {}
    for dim, key in _table(table.get("convert", {}), f"{side}.convert", None).items():
        if not _index(dim, width):
            raise EmbodimentError(f"{side}.convert: {dim!r} is not a model dim in [0, {width})")
        if key not in conversions:
            raise EmbodimentError(f"{side}.convert: dim {dim} names conversion {key!r}, which conversions does "
                                  f"not define (defined: {sorted(conversions)})")
        convert[dim] = conversions[key]
        used.add(key)
    return DimMap(tuple(float(s) for s in sign), convert)


def _conversion(name: str, spec: Any) -> Conversion:
    spec = _table(spec, f"conversions.{name}", None)
    kind = spec.get("type")
    if kind not in CONVERSIONS:
        raise EmbodimentError(f"conversions.{name}: type must be one of {' | '.join(CONVERSIONS)}, got {kind!r}")
    cls, fields = CONVERSIONS[kind]
    extra = sorted(set(spec) - {"type", *fields})
    missing = [f for f in fields if f not in spec]
    bad = [f for f in fields if f in spec and not _number(spec[f])]
    if extra or missing or bad:
        raise EmbodimentError(f"conversions.{name} ({kind}) takes the numbers {', '.join(fields)}"
                              + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
                              + (f"; not finite numbers {bad}" if bad else ""))
    conversion = cls(**{f: float(spec[f]) for f in fields})
    degenerate = {Linear: lambda c: c.scale == 0, Range: lambda c: c.high == c.low,
                  Linkage: lambda c: c.high == c.low or c.open == c.closed or not c.arm_length > c.horn_radius > 0}
    if degenerate[cls](conversion):
        raise EmbodimentError(f"conversions.{name} ({kind}) cannot be inverted with these numbers")
    return conversion


def _openpi_keys(value: Any, state_dims: int | None) -> OpenpiKeys:
    table = _table(value, "openpi_keys", ("state", "images", "optional_images", "image_layout", "metadata"))
    state = table.get("state", [])
    pairs = [(e, None) if isinstance(e, str) else tuple(e) if isinstance(e, list) and len(e) == 2 else None
             for e in state] if isinstance(state, list) else [None]
    if not all(p is not None and isinstance(p[0], str) and p[0]
               and (p[1] is None or isinstance(p[1], int) and not isinstance(p[1], bool) and p[1] > 0)
               for p in pairs):
        raise EmbodimentError(f"openpi_keys.state must list [key, width] pairs (or one key alone: any width), got "
                              f"{state!r}")
    if any(w is None for _, w in pairs) and len(pairs) > 1:
        raise EmbodimentError("openpi_keys.state: a key without a width (any width) must be the only state key")
    width = sum(w or 0 for _, w in pairs)
    if state_dims is not None and pairs and width != state_dims:
        raise EmbodimentError(f"openpi_keys.state adds up to {width} dims, state.dims is {state_dims}")
    images = _table(table.get("images", {}), "openpi_keys.images", None)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in images.items()):
        raise EmbodimentError("openpi_keys.images must map openpi image keys to model image keys")
    optional = table.get("optional_images", [])
    if not isinstance(optional, list) or not all(k in images for k in optional):
        raise EmbodimentError(f"openpi_keys.optional_images must list keys of openpi_keys.images, got {optional!r}")
    layout = table.get("image_layout", "hwc")
    if layout not in IMAGE_LAYOUTS:
        raise EmbodimentError(f"openpi_keys.image_layout must be one of {' | '.join(IMAGE_LAYOUTS)}, got {layout!r}")
    metadata = _table(table.get("metadata", {}), "openpi_keys.metadata", None)
    return OpenpiKeys(tuple(pairs), tuple(images.items()), tuple(optional), layout, dict(metadata))


def _velocity(value: Any) -> VelocityScale:
    """`velocity: {step, limit}`: a velocity dim's number v moves its joint by step x v per control step, the
    vector of velocity dims scaled down as a whole where max |v| > limit (DROID: step 0.2 rad, limit 1)."""
    table = _table(value, "velocity", ("step", "limit"))
    step, limit = table.get("step"), table.get("limit")
    if not (_number(step) and step > 0):
        raise EmbodimentError(f"velocity.step must be a positive number (robot units per step for v = 1), got {step!r}")
    if limit is not None and not (_number(limit) and limit > 0):
        raise EmbodimentError(f"velocity.limit must be a positive number or absent, got {limit!r}")
    return VelocityScale(float(step), None if limit is None else float(limit))


def _action_filter(action: dict, kinds: list[str]) -> ActionFilter | None:
    """`action.clip: [low, high]` and `action.binarize: threshold` (the gripper dims), both optional."""
    clip, threshold = action.get("clip"), action.get("binarize")
    if clip is not None and not (isinstance(clip, list) and len(clip) == 2 and all(_number(c) for c in clip)
                                 and clip[0] < clip[1]):
        raise EmbodimentError(f"action.clip must be [low, high] with low < high, got {clip!r}")
    if threshold is not None:
        if not _number(threshold):
            raise EmbodimentError(f"action.binarize must be a number (the gripper threshold), got {threshold!r}")
        if GRIPPER not in kinds:
            raise EmbodimentError("action.binarize: the profile has no gripper dims to binarize")
    if clip is None and threshold is None:
        return None
    return ActionFilter(None if clip is None else (float(clip[0]), float(clip[1])),
                        None if threshold is None else float(threshold))
