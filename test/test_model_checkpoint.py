"""Checkpoints in LeRobot's pi05 layout: round trip, real tensor names and aliases, strict rejection."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from oxygen_ros.model.checkpoint import (
    CheckpointError,
    config_from_lerobot,
    load_checkpoint,
    save_checkpoint,
)
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.preprocess import Observation, prepare_inputs
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer

CFG = get_preset("tiny")
PG = "model.paligemma_with_expert.paligemma."
VIS = PG + "model.vision_tower.vision_model."
LM = PG + "model.language_model."
EX = "model.paligemma_with_expert.gemma_expert."
# Tensor names of a LeRobot pi05 model.safetensors (N = layer index), as a real file lists them.
LEROBOT_NAMES = [
    PG + "lm_head.weight",
    VIS + "embeddings.patch_embedding.weight",
    VIS + "embeddings.patch_embedding.bias",
    VIS + "embeddings.position_embedding.weight",
    *(
        VIS + f"encoder.layers.N.{part}.{p}"
        for part in ("layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2")
        + tuple(f"self_attn.{x}_proj" for x in "kvq")
        + ("self_attn.out_proj",)
        for p in ("weight", "bias")
    ),
    VIS + "post_layernorm.weight",
    VIS + "post_layernorm.bias",
    PG + "model.multi_modal_projector.linear.weight",
    PG + "model.multi_modal_projector.linear.bias",
    LM + "embed_tokens.weight",
    *(LM + f"layers.N.self_attn.{x}_proj.weight" for x in "qkvo"),
    *(LM + f"layers.N.mlp.{x}_proj.weight" for x in ("gate", "up", "down")),
    LM + "layers.N.input_layernorm.weight",
    LM + "layers.N.post_attention_layernorm.weight",
    LM + "norm.weight",
    EX + "lm_head.weight",
    *(EX + f"model.layers.N.self_attn.{x}_proj.weight" for x in "qkvo"),
    *(EX + f"model.layers.N.mlp.{x}_proj.weight" for x in ("gate", "up", "down")),
    *(
        EX + f"model.layers.N.{n}.dense.{p}"
        for n in ("input_layernorm", "post_attention_layernorm")
        for p in ("weight", "bias")
    ),
    EX + "model.norm.dense.weight",
    EX + "model.norm.dense.bias",
    *(
        f"model.{m}.{p}"
        for m in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")
        for p in ("weight", "bias")
    ),
]


def expand(names, vision_depth, depth):
    out = set()
    for name in names:
        n = vision_depth if name.startswith(VIS) else depth
        out |= {name.replace(".N.", f".{i}.") for i in range(n)} if ".N." in name else {name}
    return out


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=3)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tokenizer = load_tokenizer(train_tokenizer(tmp_path_factory.mktemp("tok") / "t.model", CFG.vocab_size))
    rng = np.random.default_rng(0)
    obs = [
        Observation(
            {"base_0_rgb": rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)}, np.array([0.2, -0.4]), "stack"
        ),
        Observation(
            {n: rng.integers(0, 255, (56, 56, 3), dtype=np.uint8) for n in CFG.camera_names},
            np.zeros(3),
            "go",
        ),
    ]
    return prepare_inputs(obs, CFG, tokenizer)


def outputs(model, batch):
    cache = KVCache(CFG, num_slots=2, max_len=CFG.prefix_len)
    slots = torch.tensor([0, 1])
    result = model.prefill(batch, cache, slots, want_logits=True)
    noise = torch.randn(2, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(0))
    return result.logits, model.sample_actions(cache, slots, noise)


def test_save_writes_lerobot_names_and_round_trips(model, batch, tmp_path):
    stats = {"observation.state": {"q01": np.zeros(3), "q99": np.ones(3)}, "action": {"q01": -np.ones(8)}}
    save_checkpoint(model, tmp_path, stats)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    expected = expand(LEROBOT_NAMES, CFG.vision.depth, CFG.backbone.depth)
    assert names == expected - {EX + "lm_head.weight"}  # the unused expert LM head is not written
    assert json.loads((tmp_path / "config.json").read_text())["type"] == "pi05"

    loaded = load_checkpoint(tmp_path)
    for a, b in zip(outputs(model, batch), outputs(loaded.model, batch)):
        assert torch.equal(a, b)
    np.testing.assert_array_equal(loaded.norm_stats["observation.state"]["q99"], np.ones(3))
    np.testing.assert_array_equal(loaded.norm_stats["action"]["q01"], -np.ones(8))


def test_loads_older_names_without_embed_tokens(model, batch, tmp_path):
    save_checkpoint(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors[LM + "embed_tokens.weight"]  # tied: only lm_head carries it
    for part in ("in", "out"):
        for p in ("weight", "bias"):
            tensors[f"model.action_time_mlp_{part}.{p}"] = tensors.pop(f"model.time_mlp_{part}.{p}")
    tensors["model.state_proj.weight"] = torch.zeros(CFG.backbone.width, CFG.state_dim)
    tensors["model.state_proj.bias"] = torch.zeros(CFG.backbone.width)
    tensors[EX + "lm_head.weight"] = torch.zeros(CFG.vocab_size, CFG.expert.width)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path)
    for a, b in zip(outputs(model, batch), outputs(loaded.model, batch)):
        assert torch.equal(a, b)


def test_broken_checkpoints_name_the_offending_tensors(model, tmp_path):
    save_checkpoint(model, tmp_path)
    good = load_file(str(tmp_path / "model.safetensors"))
    missing = LM + "layers.1.mlp.up_proj.weight"
    resized = EX + "model.layers.0.self_attn.k_proj.weight"
    broken = {k: v for k, v in good.items() if k != missing}
    broken["model.bogus_head.weight"] = torch.zeros(2)
    broken[resized] = torch.zeros(3, 3)
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    message = str(err.value)
    for name in (missing, "model.bogus_head.weight", resized):
        assert name in message
    assert "missing (1)" in message and "unexpected (1)" in message and "wrong shape (1)" in message


def test_lerobot_config_maps_to_the_pi05_preset():
    data = {
        "type": "pi05",
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "chunk_size": 50,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "image_resolution": [224, 224],
        "tokenizer_max_length": 200,
        "input_features": {
            "observation.images.base_0_rgb": {},
            "observation.images.left_wrist_0_rgb": {},
            "observation.images.right_wrist_0_rgb": {},
            "observation.state": {},
        },
    }
    assert config_from_lerobot(data) == get_preset("pi05")
    with pytest.raises(CheckpointError, match="variant"):
        config_from_lerobot({**data, "paligemma_variant": "gemma_7b"})
