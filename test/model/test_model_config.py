"""Presets, config JSON, and the parameter count of the full-size model (built on the meta device)."""

import dataclasses
import time

import pytest
import torch

from oxygen_ros.model.config import PRESETS, GemmaConfig, Pi05Config, get_preset
from oxygen_ros.model.inputs import ModelInputs
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model, build_model, parameter_counts


def test_pi05_parameter_count_matches_the_released_model_without_allocating():
    with torch.device("meta"):
        model = Pi05Model(get_preset("pi05"))
    assert all(p.is_meta for p in model.parameters())
    counts = parameter_counts(model)
    # Gemma 2B with its 257k-token embedding, SigLIP So400m + projector, Gemma 300M expert with adaRMS.
    assert 2.50e9 < counts["backbone"] < 2.52e9
    assert 4.10e8 < counts["vision"] < 4.20e8
    assert 4.20e8 < counts["expert"] < 4.35e8
    assert 3.30e9 < counts["total"] < 3.40e9
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")


def test_pi05_shapes():
    cfg = get_preset("pi05")
    assert cfg.prefix_len == 3 * 256 + 200 == 968
    # 18 layers x (K, V) x 968 x 1 head x 256 x 2 bytes ~ 17 MiB per slot in bf16.
    per_slot = 18 * 2 * 968 * 256 * 2
    assert 16.5 * 2**20 < per_slot < 17.5 * 2**20


def test_fullvocab_preset_has_the_real_vocabulary_at_tiny_widths():
    cfg, real = get_preset("fullvocab"), get_preset("pi05")
    assert cfg.vocab_size == real.vocab_size == 257_152
    assert cfg.camera_names == real.camera_names and cfg.vision.image_size == 224
    assert cfg.prefix_len == 3 * 256 + 100 == 868
    with torch.device("meta"):
        counts = parameter_counts(Pi05Model(cfg))
    # The text head (the tied embedding) is most of the backbone: the regime a real checkpoint decodes in.
    assert 257_152 * 64 / counts["backbone"] > 0.9


def test_config_json_round_trip(tmp_path):
    for name, cfg in PRESETS.items():
        cfg.save_json(tmp_path / f"{name}.json")
        assert Pi05Config.load_json(tmp_path / f"{name}.json") == cfg


def test_image_crops_round_trip_and_are_checked(tmp_path):
    cfg = get_preset("tiny").replace(image_crops=(("base_0_rgb", (0.1, 0.2, 0.6, 0.7)),))
    cfg.save_json(tmp_path / "crop.json")
    assert Pi05Config.load_json(tmp_path / "crop.json") == cfg
    assert cfg.image_crop("base_0_rgb") == (0.1, 0.2, 0.6, 0.7) and cfg.image_crop("left_wrist_0_rgb") is None
    with pytest.raises(ValueError, match="not one of"):
        cfg.replace(image_crops=(("right_wrist_0_rgb", (0.1, 0.2, 0.6, 0.7)),))
    with pytest.raises(ValueError, match="top < bottom"):
        cfg.replace(image_crops=(("base_0_rgb", (0.6, 0.2, 0.1, 0.7)),))
    with pytest.raises(ValueError, match="four numbers"):
        cfg.replace(image_crops=(("base_0_rgb", (0.1, 0.2, 0.6)),))


def test_config_rejects_mismatched_experts_and_unknown_fields():
    cfg = get_preset("tiny")
    with pytest.raises(ValueError, match="head_dim"):
        cfg.replace(expert=dataclasses.replace(cfg.expert, head_dim=8))
    with pytest.raises(ValueError, match="unknown Pi05Config fields"):
        Pi05Config.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")
    assert isinstance(cfg.backbone, GemmaConfig)


def test_tiny_preset_calls_are_fast():
    cfg = get_preset("tiny")
    model = build_model(cfg)
    cache = KVCache(cfg, num_slots=2, max_len=cfg.prefix_len + 4)
    size = cfg.vision.image_size
    batch = ModelInputs(
        images=torch.zeros(2, cfg.num_cameras, 3, size, size),
        image_masks=torch.ones(2, cfg.num_cameras, dtype=torch.bool),
        tokens=torch.full((2, cfg.max_token_len), 5),
        token_masks=torch.ones(2, cfg.max_token_len, dtype=torch.bool),
    )
    slots, p = torch.tensor([0, 1]), cfg.prefix_len

    def one_round() -> float:
        start = time.perf_counter()
        result = model.prefill(batch, cache, slots, want_logits=True)
        model.sample_actions(cache, slots, torch.randn(2, cfg.action_horizon, cfg.action_dim))
        model.decode_step(cache, slots, torch.tensor([3, 4]), torch.tensor([p, p]), result.num_valid)
        return time.perf_counter() - start

    # Best of three after a warm-up: the machine may be shared, we want the code's cost, not the neighbours'.
    one_round()
    assert min(one_round() for _ in range(3)) < 0.5


def test_build_model_is_seeded_and_keeps_global_rng():
    cfg = get_preset("tiny")
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = build_model(cfg, seed=7), build_model(cfg, seed=7), build_model(cfg, seed=8)
    assert torch.equal(torch.rand(1), expected_next)
    assert torch.equal(a.time_mlp_in.weight, b.time_mlp_in.weight)
    assert not torch.equal(a.time_mlp_in.weight, c.time_mlp_in.weight)
    assert a.dtype == torch.float32 and build_model(cfg, dtype=torch.bfloat16).dtype == torch.bfloat16
