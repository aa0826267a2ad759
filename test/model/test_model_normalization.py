"""Every LeRobot normalization mode, read from a tiny LeRobot-layout checkpoint as LeRobot saves one, applied with
exactly LeRobot's formulas (eps included); openpi's folders with openpi's; bad modes refused in one line.

The expected values are written out here from `lerobot/processor/normalize_processor.py` (LeRobot 7427f31,
`_apply_transform`, lines 329-421), in torch float32 as LeRobot computes them, independently of the code under test.
"""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from oxygen_ros.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.preprocess import normalized_state, robot_actions

CFG = get_preset("tiny")
STATE_DIMS, ACTION_DIMS = 4, 3
RNG = np.random.default_rng(7)


def _stats(width: int) -> dict[str, np.ndarray]:
    """Every statistic LeRobot's stats files carry; the last dim is constant (std 0, min == max, q01 == q99 ...),
    where LeRobot's eps handling decides the result."""
    low = RNG.uniform(-2.0, 0.0, width)
    high = low + RNG.uniform(0.5, 3.0, width)
    high[-1] = low[-1]
    std = (high - low) / 4
    return {"mean": (low + high) / 2, "std": std, "min": low - 0.1 * std, "max": high + 0.1 * std,
            "q01": low, "q99": high, "q10": low + 0.1 * (high - low), "q90": high - 0.1 * (high - low),
            "count": np.array([1000.0])}


STATS = {"observation.state": _stats(STATE_DIMS), "action": _stats(ACTION_DIMS)}


def lerobot_transform(x: np.ndarray, stats: dict, mode: str, eps: float, inverse: bool) -> np.ndarray:
    """LeRobot's `_apply_transform`, line by line, on float32 tensors."""
    t = torch.as_tensor(x, dtype=torch.float32)
    s = {k: torch.as_tensor(v[: t.shape[-1]] if v.size > 1 else v, dtype=torch.float32) for k, v in stats.items()}
    e = torch.tensor(eps, dtype=torch.float32)
    if mode == "IDENTITY":  # lines 329-331
        return t.numpy()
    if mode == "MEAN_STD":  # lines 349-362
        return (t * s["std"] + s["mean"] if inverse else (t - s["mean"]) / (s["std"] + eps)).numpy()
    low, high = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}[mode]
    denom = torch.where(s[high] - s[low] == 0, e, s[high] - s[low])  # lines 373-378, 394-398, 411-415
    if mode == "MIN_MAX":
        return ((t + 1) / 2 * denom + s[low] if inverse else 2 * (t - s[low]) / denom - 1).numpy()
    return ((t + 1.0) * denom / 2.0 + s[low] if inverse else 2.0 * (t - s[low]) / denom - 1.0).numpy()


def write_pipelines(folder, state_mode: str, action_mode: str, eps: float = 1e-8) -> None:
    """LeRobot's saved processor pipelines: the preprocessor's normalizer (state and action features), the
    postprocessor's unnormalizer (action), one norm_map each, their stats in one state file each."""
    features = {"observation.state": {"type": "STATE", "shape": [STATE_DIMS]},
                "observation.images.base_0_rgb": {"type": "VISUAL", "shape": [3, 224, 224]},
                "action": {"type": "ACTION", "shape": [ACTION_DIMS]}}
    norm_map = {"VISUAL": "IDENTITY", "STATE": state_mode, "ACTION": action_mode}
    flat = {f"{f}.{k}": torch.from_numpy(np.asarray(v, dtype=np.float32)) for f, st in STATS.items()
            for k, v in st.items()}
    for name, step, state_file in (("policy_preprocessor", "normalizer_processor", "pre_stats.safetensors"),
                                   ("policy_postprocessor", "unnormalizer_processor", "post_stats.safetensors")):
        save_file(flat, str(folder / state_file))
        config = {"eps": eps, "features": features, "norm_map": norm_map}
        steps = [{"registry_name": "to_batch_processor", "config": {}},
                 {"registry_name": step, "config": config, "state_file": state_file}]
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}))


@pytest.fixture(scope="module")
def model():
    return build_model(CFG)


@pytest.fixture
def folder(model, tmp_path):
    save_checkpoint(model, tmp_path)  # no stats of its own: the pipelines' state files carry them
    return tmp_path


PAIRS = [("MEAN_STD", "MEAN_STD"), ("QUANTILES", "QUANTILES"), ("QUANTILE10", "QUANTILE10"),
         ("IDENTITY", "IDENTITY"), ("MIN_MAX", "MIN_MAX"), ("MEAN_STD", "QUANTILE10"), ("QUANTILE10", "MIN_MAX"),
         ("IDENTITY", "MEAN_STD"), ("QUANTILES", "IDENTITY")]


@pytest.mark.parametrize("state_mode,action_mode", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_each_mode_normalizes_and_unnormalizes_as_lerobot(folder, state_mode, action_mode):
    write_pipelines(folder, state_mode, action_mode)
    norm = load_checkpoint(folder).norm_stats
    assert norm.modes == {"observation.state": state_mode, "action": action_mode}
    state = STATS["observation.state"]["mean"] + np.array([0.3, -0.7, 1.1, 0.4])  # the last dim off its constant
    got = normalized_state(state, CFG, norm)
    expected = lerobot_transform(state, STATS["observation.state"], state_mode, 1e-8, inverse=False)
    np.testing.assert_allclose(got[:STATE_DIMS], expected, rtol=1e-5)
    assert not got[STATE_DIMS:].any()  # padded to the model's width
    model_out = torch.from_numpy(RNG.uniform(-1.2, 1.2, (1, CFG.action_horizon, CFG.action_dim)).astype(np.float32))
    got = robot_actions(model_out, ACTION_DIMS, norm)[0]
    expected = lerobot_transform(model_out[0, :, :ACTION_DIMS].numpy(), STATS["action"], action_mode, 1e-8,
                                 inverse=True)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_constant_dim_uses_lerobots_eps_of_the_pipeline_file(folder):
    write_pipelines(folder, "QUANTILES", "MEAN_STD", eps=1e-3)
    norm = load_checkpoint(folder).norm_stats
    state = STATS["observation.state"]["q01"] + 0.5
    # q99 == q01 on the last dim: LeRobot divides by eps there (1e-3 from the file), not by eps + 0.
    np.testing.assert_allclose(normalized_state(state, CFG, norm)[STATE_DIMS - 1], 2.0 * 0.5 / 1e-3 - 1.0, rtol=1e-6)
    stats = STATS["action"]
    # std 0 on the last dim: forward (x - mean) / (0 + eps), back y * std + mean = mean (no eps on the way back).
    raw = stats["mean"] + 0.25
    np.testing.assert_allclose(norm.normalize("action", raw)[-1], 0.25 / 1e-3, rtol=1e-6)
    np.testing.assert_allclose(norm.unnormalize("action", np.array([0.0, 0.0, 5.0]))[-1], stats["mean"][-1])


def test_config_normalization_mapping_applies_without_pipelines(model, tmp_path):
    save_checkpoint(model, tmp_path, STATS)
    config = json.loads((tmp_path / "config.json").read_text())
    config["normalization_mapping"] = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILE10"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    norm = load_checkpoint(tmp_path).norm_stats
    assert norm.modes == {"observation.state": "MEAN_STD", "action": "QUANTILE10"}
    state = STATS["observation.state"]["mean"] + 0.2
    np.testing.assert_allclose(normalized_state(state, CFG, norm)[:STATE_DIMS],
                               lerobot_transform(state, STATS["observation.state"], "MEAN_STD", 1e-8, False),
                               rtol=1e-5)


def test_openpi_folder_uses_openpis_quantile_formula(model, tmp_path):
    from test_model_checkpoint import write_openpi

    loaded = load_checkpoint(write_openpi(model, tmp_path))
    stats = loaded.norm_stats["action"]
    q01, q99 = stats["q01"][:3], stats["q99"][:3]
    y = np.array([-1.0, 0.2, 1.0])
    # openpi transforms.py lines 175-181: (y + 1) / 2 * (q99 - q01 + 1e-6) + q01
    np.testing.assert_allclose(loaded.norm_stats.unnormalize("action", y), (y + 1) / 2 * (q99 - q01 + 1e-6) + q01,
                               rtol=1e-12)
    assert loaded.norm_stats.convention == "openpi"


@pytest.mark.parametrize("edit,message", [
    (lambda m: {**m, "STATE": "ZSCORE"}, "unknown normalization mode 'ZSCORE'"),
    (lambda m: {**m, "VISUAL": "MEAN_STD"}, "normalizes VISUAL features with MEAN_STD: not supported"),
])
def test_a_bad_norm_map_is_one_error_line(folder, edit, message):
    write_pipelines(folder, "QUANTILES", "QUANTILES")
    path = folder / "policy_preprocessor.json"
    data = json.loads(path.read_text())
    data["steps"][1]["config"]["norm_map"] = edit(data["steps"][1]["config"]["norm_map"])
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(folder)
    assert "\n" not in str(err.value)


def test_a_mode_whose_stats_are_missing_names_them(model, tmp_path):
    save_checkpoint(model, tmp_path, {f: {k: v for k, v in st.items() if k in ("q01", "q99")}
                                      for f, st in STATS.items()})
    config = json.loads((tmp_path / "config.json").read_text())
    config["normalization_mapping"] = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILES"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"observation.state .* lack mean and std .* its mode MEAN_STD needs"):
        load_checkpoint(tmp_path)

