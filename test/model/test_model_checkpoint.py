"""Checkpoints in LeRobot's and openpi's pi05 layouts: round trip, real tensor names and aliases, the text head each
stack decodes with, norm stats from every place they are kept, strict rejection of every malformed variant."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from oxygen_ros.model.checkpoint import (
    CheckpointError,
    TrainedOn,
    config_from_lerobot,
    config_from_openpi,
    load_checkpoint,
    save_checkpoint,
)
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.generate import greedy_decode
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


STATS = {"observation.state": {"q01": -np.ones(14), "q99": np.ones(14)},
         "action": {"q01": -2 * np.ones(14), "q99": 2 * np.ones(14)}}


def outputs(model, batch):
    cache = KVCache(CFG, num_slots=2, max_len=CFG.prefix_len)
    slots = torch.tensor([0, 1])
    result = model.prefill(batch, cache, slots, want_logits=True)
    noise = torch.randn(2, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(0))
    return result.logits, model.sample_actions(cache, slots, noise)


def actions_and_tokens(model, batch, new_tokens=6):
    """The action chunk and greedy narration tokens of a batch, as the engine would produce them."""
    cache = KVCache(CFG, num_slots=2, max_len=CFG.prefix_len + new_tokens)
    slots = torch.tensor([0, 1])
    result = model.prefill(batch, cache, slots, want_logits=True)
    noise = torch.randn(2, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(0))
    actions = model.sample_actions(cache, slots, noise)
    return actions, greedy_decode(model, cache, slots, result, new_tokens, eos_id=-1)


def test_save_writes_lerobot_names_and_round_trips(model, batch, tmp_path):
    stats = {"observation.state": {"q01": np.zeros(3), "q99": np.ones(3)},
             "action": {"q01": -np.ones(8), "q99": np.ones(8)}}
    save_checkpoint(model, tmp_path, stats)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    expected = expand(LEROBOT_NAMES, CFG.vision.depth, CFG.backbone.depth)
    assert names == expected - {EX + "lm_head.weight"}  # the unused expert LM head is not written
    assert json.loads((tmp_path / "config.json").read_text())["type"] == "pi05"

    loaded = load_checkpoint(tmp_path)
    assert loaded.layout == "lerobot" and loaded.text_head.choice == "embedding"
    for a, b in zip(outputs(model, batch), outputs(loaded.model, batch)):
        assert torch.equal(a, b)
    np.testing.assert_array_equal(loaded.norm_stats["observation.state"]["q99"], np.ones(3))
    np.testing.assert_array_equal(loaded.norm_stats["action"]["q01"], -np.ones(8))
    # what it says about its action space: LeRobot's default, absolute; with our mark, the profile trained in
    assert loaded.trained_on == TrainedOn(lerobot_relative=False, lerobot_exclude=("gripper",))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_relative_actions": True,
                                                      "action_feature_names": ["a", "gripper"]}))
    assert load_checkpoint(tmp_path).trained_on == TrainedOn(lerobot_relative=True, lerobot_exclude=("gripper",),
                                                             lerobot_action_names=("a", "gripper"))
    save_checkpoint(model, tmp_path, stats, embodiment="aloha")
    assert load_checkpoint(tmp_path).trained_on == TrainedOn(embodiment="aloha")


def test_loads_older_names_without_embed_tokens(model, batch, tmp_path):
    save_checkpoint(model, tmp_path, STATS)
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
    backbone = loaded.model.backbone
    assert backbone.lm_head is None and backbone.text_head is backbone.embed_tokens.weight  # one tensor
    assert loaded.text_head.choice == "embedding" and "once" in loaded.text_head.reason


# ---- the text head ------------------------------------------------------------------------------------------------

def fine_tuned(model, path, seed=5):
    """A LeRobot checkpoint as fine-tuning leaves it: the embedding moved, lm_head kept its own values."""
    save_checkpoint(model, path, STATS)
    tensors = load_file(str(path / "model.safetensors"))
    head = torch.randn(CFG.vocab_size, CFG.backbone.width, generator=torch.Generator().manual_seed(seed))
    tensors[PG + "lm_head.weight"] = head
    save_file(tensors, str(path / "model.safetensors"))
    return head


def capture_final_norm(model):
    """Record the backbone's final-norm output: the hidden states the text head multiplies."""
    seen = []
    model.backbone.norm.register_forward_hook(lambda module, args, out: seen.append(out[0].detach().clone()))
    return seen


def test_untied_lm_head_decodes_with_the_files_head(model, batch, tmp_path):
    head = fine_tuned(model, tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.text_head.choice == "lm_head" and "differs" in loaded.text_head.reason
    backbone = loaded.model.backbone
    assert torch.equal(backbone.lm_head, head) and backbone.lm_head.data_ptr() != backbone.embed_tokens.weight.data_ptr()
    hidden = capture_final_norm(loaded.model)
    cache = KVCache(CFG, num_slots=2, max_len=CFG.prefix_len + 1)
    logits = loaded.model.prefill(batch, cache, torch.tensor([0, 1]), want_logits=True).logits
    assert torch.equal(logits, (hidden[-1] @ head.T).float())
    step = loaded.model.decode_step(cache, torch.tensor([0, 1]), logits.argmax(-1), torch.tensor([CFG.prefix_len] * 2),
                                    torch.tensor([CFG.prefix_len] * 2))
    assert torch.equal(step, (hidden[-1] @ head.T).float())

    # The override decodes the same file with the embedding: same actions, other narration tokens.
    embedding = load_checkpoint(tmp_path, text_head="embedding")
    assert embedding.text_head.choice == "embedding" and embedding.model.backbone.lm_head is None
    (actions_a, tokens_a), (actions_b, tokens_b) = (actions_and_tokens(m.model, batch) for m in (loaded, embedding))
    assert torch.equal(actions_a, actions_b) and tokens_a != tokens_b

    # Saved as loaded: the untied head goes back into lm_head and loads untied again.
    save_checkpoint(loaded.model, tmp_path / "again", loaded.norm_stats)
    again = load_checkpoint(tmp_path / "again")
    assert again.text_head.choice == "lm_head" and torch.equal(again.model.backbone.lm_head, head)
    assert actions_and_tokens(again.model, batch)[1] == tokens_a


def test_tied_head_keeps_one_tensor_and_lm_head_must_exist_when_asked(model, tmp_path):
    save_checkpoint(model, tmp_path, STATS)  # lm_head written equal to the embedding
    for wanted in ("auto", "lm_head", "embedding"):
        loaded = load_checkpoint(tmp_path, text_head=wanted)
        backbone = loaded.model.backbone
        assert backbone.lm_head is None and backbone.text_head is backbone.embed_tokens.weight
        big = [n for n, p in loaded.model.named_parameters() if p.shape[0] == CFG.vocab_size]
        assert big == ["backbone.embed_tokens.weight"], big
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors[PG + "lm_head.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_checkpoint(tmp_path).text_head.choice == "embedding"
    with pytest.raises(CheckpointError, match="text_head is lm_head but model.safetensors has no " + PG):
        load_checkpoint(tmp_path, text_head="lm_head")


# ---- openpi's PyTorch layout -----------------------------------------------------------------------------------

def write_openpi(model, path, lm_head=None):
    """The folder openpi's JAX -> PyTorch converter writes, for the same weights: names without `model.`, the tied
    embedding stored once as lm_head, the expert's unused lm_head, its small config.json and assets norm stats."""
    save_checkpoint(model, path / "lerobot", STATS)
    tensors = {k.removeprefix("model."): v for k, v in load_file(str(path / "lerobot" / "model.safetensors")).items()}
    embed = tensors.pop(LM.removeprefix("model.") + "embed_tokens.weight")
    tensors[PG.removeprefix("model.") + "lm_head.weight"] = embed
    if lm_head is not None:  # a file that keeps both
        tensors[LM.removeprefix("model.") + "embed_tokens.weight"] = embed
        tensors[PG.removeprefix("model.") + "lm_head.weight"] = lm_head
    tensors[EX.removeprefix("model.") + "lm_head.weight"] = torch.zeros(CFG.vocab_size, CFG.expert.width)
    folder = path / "openpi"
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"action_dim": CFG.action_dim, "action_horizon": CFG.action_horizon, "paligemma_variant": "gemma_2b",
              "action_expert_variant": "gemma_300m", "precision": "float32",
              "oxygen_ros": CFG.to_dict()}  # the tiny shape: a real converter config names only the variants
    (folder / "config.json").write_text(json.dumps(config))
    assets = folder / "assets" / "physical-intelligence" / "aloha"
    assets.mkdir(parents=True)
    norm = {"norm_stats": {
        name: {"mean": [0.0] * 14, "std": [1.0] * 14, "q01": STATS[ours]["q01"].tolist(),
               "q99": STATS[ours]["q99"].tolist()}
        for name, ours in (("state", "observation.state"), ("actions", "action"))}}
    (assets / "norm_stats.json").write_text(json.dumps(norm))
    return folder


def test_openpi_layout_gives_the_same_actions_and_tokens(model, batch, tmp_path):
    folder = write_openpi(model, tmp_path)
    openpi, lerobot = load_checkpoint(folder), load_checkpoint(tmp_path / "lerobot")
    assert openpi.layout == "openpi" and lerobot.layout == "lerobot"
    assert openpi.trained_on.openpi_asset_id == "physical-intelligence/aloha" and openpi.trained_on.openpi_config is None
    assert openpi.model.backbone.lm_head is None
    actions_a, tokens_a = actions_and_tokens(openpi.model, batch)
    actions_b, tokens_b = actions_and_tokens(lerobot.model, batch)
    assert torch.equal(actions_a, actions_b) and tokens_a == tokens_b
    for feature in ("observation.state", "action"):
        for stat in ("q01", "q99"):
            np.testing.assert_array_equal(openpi.norm_stats[feature][stat], lerobot.norm_stats[feature][stat])


def test_openpi_decodes_with_the_embedding_even_when_its_lm_head_differs(model, batch, tmp_path):
    head = torch.randn(CFG.vocab_size, CFG.backbone.width, generator=torch.Generator().manual_seed(9))
    folder = write_openpi(model, tmp_path, lm_head=head)
    loaded = load_checkpoint(folder)
    assert loaded.text_head.choice == "embedding" and "openpi" in loaded.text_head.reason
    assert actions_and_tokens(loaded.model, batch)[1] == actions_and_tokens(model, batch)[1]
    forced = load_checkpoint(folder, text_head="lm_head")
    assert forced.text_head.choice == "lm_head" and torch.equal(forced.model.backbone.lm_head, head)


def test_openpi_config_maps_to_the_pi05_shapes():
    data = {"action_dim": 32, "action_horizon": 15, "paligemma_variant": "gemma_2b",
            "action_expert_variant": "gemma_300m", "precision": "bfloat16"}
    assert config_from_openpi(data) == get_preset("pi05").replace(action_horizon=15)


# ---- what a broken folder says --------------------------------------------------------------------------------

def test_broken_checkpoints_name_the_offending_tensors(model, tmp_path):
    save_checkpoint(model, tmp_path, STATS)
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
    assert "\n" not in message


def _tensors(path):
    return load_file(str(path / "model.safetensors"))


def _put(path, tensors):
    save_file(tensors, str(path / "model.safetensors"))


def _edit_tensor(name, change):
    def edit(path):
        tensors = _tensors(path)
        tensors[name] = change(tensors[name].clone())
        _put(path, tensors)
    return edit


def _drop(name):
    def edit(path):
        tensors = _tensors(path)
        del tensors[name]
        _put(path, tensors)
    return edit


def _cut(keep):
    def edit(path):
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: keep(len(data))])
    return edit


def _config(text):
    return lambda path: (path / "config.json").write_text(text)


def _stats(stats):
    def edit(path):
        for file in path.glob("policy_*"):
            file.unlink()
        save_file({f"{f}.{s}": torch.as_tensor(np.asarray(v, dtype=np.float32)) for f, d in stats.items()
                   for s, v in d.items()}, str(path / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    return edit


def _no_stats(path):
    for file in path.glob("policy_*"):
        file.unlink()


def _nan(t):
    t.view(-1)[7] = float("nan")
    return t


NON_FINITE = "model.safetensors holds NaN or infinite values: tensors (1): "
GOOD_ACTION = {"q01": -np.ones(14), "q99": np.ones(14)}
BROKEN = {
    "missing tensor": (_drop(EX + "model.norm.dense.bias"), "missing (1): " + EX + "model.norm.dense.bias"),
    "wrong shape": (_edit_tensor("model.action_in_proj.bias", lambda t: torch.zeros(5)),
                    "wrong shape (1): model.action_in_proj.bias (file (5,), model (32,))"),
    "unknown key": (lambda p: _put(p, {**_tensors(p), "model.extra_head.weight": torch.zeros(1)}),
                    "unexpected (1): model.extra_head.weight"),
    "nan weight": (_edit_tensor(LM + "layers.0.mlp.down_proj.weight", _nan),
                   NON_FINITE + LM + "layers.0.mlp.down_proj.weight"),
    "inf lm_head": (_edit_tensor(PG + "lm_head.weight", lambda t: t.fill_(float("inf"))),
                    NON_FINITE + PG + "lm_head.weight"),
    "truncated weights": (_cut(lambda n: n // 2), "model.safetensors ("),
    "empty weights": (_cut(lambda n: 0), "model.safetensors (0 bytes) is not a readable safetensors file"),
    "config of the wrong kind": (_config("[1, 2, 3]"), "config.json holds a JSON list"),
    "config of another tool": (_config('{"architectures": ["X"]}'), "config.json is neither a LeRobot pi05 config"),
    "config of another policy": (_config('{"type": "act"}'), "config.json describes policy type 'act', not pi05"),
    "config with a string field": (_config('{"type": "pi05", "chunk_size": "50"}'),
                                   "config.json: chunk_size must be a positive integer, got '50'"),
    "config not json": (_config("{"), "config.json is not valid JSON"),
    "absent stats": (_no_stats, "no normalization stats for observation.state in the folder"),
    "stats without q99": (_stats({"observation.state": {"q01": -np.ones(14), "mean": np.zeros(14)},
                                  "action": GOOD_ACTION}),
                          "observation.state in policy_preprocessor_step_3_normalizer_processor.safetensors lack "
                          "q99 (found mean, q01)"),
    "stats too wide": (_stats({"observation.state": {"q01": -np.ones(40), "q99": np.ones(40)}, "action": GOOD_ACTION}),
                       "have width 40; the model's state takes 1 to 16 dims"),
    "stats of two widths": (_stats({"observation.state": GOOD_ACTION, "action": {"q01": -np.ones(14),
                                                                                "q99": np.ones(12)}}),
                            "action in policy_preprocessor_step_3_normalizer_processor.safetensors must be vectors "
                            "of one width, got q01 (14,), q99 (12,)"),
    "nan stats": (_stats({"observation.state": {"q01": -np.ones(14), "q99": _nan(torch.ones(14)).numpy()},
                          "action": GOOD_ACTION}),
                  "normalization stat observation.state.q99 in policy_preprocessor_step_3_normalizer_processor"
                  ".safetensors contains NaN or infinite values"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_malformed_folder_fails_naming_the_problem(model, tmp_path, case):
    edit, expected = BROKEN[case]
    save_checkpoint(model, tmp_path, STATS)
    edit(tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


# ---- where LeRobot keeps norm stats ----------------------------------------------------------------------------

def test_norm_stats_from_pipeline_json_and_older_in_checkpoint_buffers(model, tmp_path):
    save_checkpoint(model, tmp_path, STATS)
    # Newer folders: the pipeline JSON names its normalizer's state file (any step index, any file name).
    stats_file = tmp_path / "policy_preprocessor_step_0_normalizer_processor.safetensors"
    stats_file.rename(tmp_path / "stats_of_step_2.safetensors")
    pipeline = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8},
         "state_file": "stats_of_step_2.safetensors"}]}
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(pipeline))
    np.testing.assert_array_equal(load_checkpoint(tmp_path).norm_stats["action"]["q99"], 2 * np.ones(14))
    pipeline["steps"][1]["state_file"] = "gone.safetensors"
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps(pipeline))
    with pytest.raises(CheckpointError, match="policy_preprocessor.json names the stats file gone.safetensors"):
        load_checkpoint(tmp_path)

    # Older folders: buffers of the normalization modules inside model.safetensors, no processor files.
    (tmp_path / "policy_preprocessor.json").unlink()
    (tmp_path / "stats_of_step_2.safetensors").unlink()
    tensors = _tensors(tmp_path)
    tensors["normalize_inputs.buffer_observation_state.q01"] = torch.full((14,), -3.0)
    tensors["normalize_inputs.buffer_observation_state.q99"] = torch.full((14,), 3.0)
    for module in ("normalize_targets", "unnormalize_outputs"):
        tensors[f"{module}.buffer_action.q01"] = torch.full((14,), -4.0)
        tensors[f"{module}.buffer_action.q99"] = torch.full((14,), 4.0)
    _put(tmp_path, tensors)
    loaded = load_checkpoint(tmp_path)
    np.testing.assert_array_equal(loaded.norm_stats["observation.state"]["q99"], np.full(14, 3.0))
    np.testing.assert_array_equal(loaded.norm_stats["action"]["q01"], np.full(14, -4.0))

    # Both places present and disagreeing: an error naming the two.
    save_file({"action.q01": torch.full((14,), -5.0)}, str(tmp_path / "policy_postprocessor_step_0_unnormalizer"
                                                                       "_processor.safetensors"))
    with pytest.raises(CheckpointError, match="action.q01 differs between policy_postprocessor_step_0_unnormalizer_"
                                              r"processor.safetensors and model.safetensors \(normalize_targets"):
        load_checkpoint(tmp_path)


def test_openpi_folder_without_norm_stats_names_the_file(model, tmp_path):
    folder = write_openpi(model, tmp_path)
    (folder / "assets" / "physical-intelligence" / "aloha" / "norm_stats.json").unlink()
    with pytest.raises(CheckpointError, match=r"no assets/<asset_id>/norm_stats.json"):
        load_checkpoint(folder)


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


def test_openpi_layout_is_as_strict_and_names_its_own_keys(model, tmp_path):
    folder = write_openpi(model, tmp_path)
    tensors = _tensors(folder)
    gone = EX.removeprefix("model.") + "model.layers.1.mlp.gate_proj.weight"
    del tensors[gone]
    tensors["model.action_in_proj.weight"] = torch.zeros(CFG.expert.width, CFG.action_dim)  # LeRobot's name
    tensors["action_out_proj.bias"] = torch.zeros(3)
    _put(folder, tensors)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    assert str(err.value) == (
        f"model.safetensors does not match the model: missing (1): {gone}; unexpected (1): "
        "model.action_in_proj.weight; wrong shape (1): action_out_proj.bias (file (3,), model (16,))")


def test_an_openpi_folder_under_its_train_configs_name_says_so(model, tmp_path):
    from oxygen_ros.control.embodiment import load_embodiment

    run = tmp_path / "checkpoints" / "pi05_full_droid_finetune" / "my_run"
    run.mkdir(parents=True)
    folder = write_openpi(model, run)  # .../pi05_full_droid_finetune/my_run/openpi
    trained = load_checkpoint(folder).trained_on
    assert trained.openpi_folders == ("openpi", "my_run", "pi05_full_droid_finetune")
    assert "pi05_full_droid_finetune trains 7 joint-position deltas" in \
        load_embodiment("droid").mismatch(trained, tuple(f"j{i}" for i in range(8)))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "config_name": "pi05_droid"}))
    assert load_checkpoint(folder).trained_on.openpi_config == "pi05_droid"
