"""The VLA node started on a checkpoint folder or hub id: corrupt files, ids that cannot be resolved and a tokenizer
of another vocabulary end start-up with exit code 1 and one clear line, a good one starts decoding with the text
head its writer used, named in the start-up log."""


import json

import numpy as np
import pytest
import torch
from hub_fixtures import cache_repo, checkpoint_files, hub_cache  # noqa: F401 - fixture
from safetensors.torch import load_file, save_file
from test_replay_node import Child
from test_vla_node_ros import ARMED  # config/aloha.yaml, armed for a test robot

from oxygen_ros.model.checkpoint import save_checkpoint
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.tokenizer import train_tokenizer
from oxygen_ros.nodes.vla_node import main as vla_node_main

from ros_test_utils import node_lines

CFG = get_preset("tiny")
LM_HEAD = "model.paligemma_with_expert.paligemma.lm_head.weight"
OVERRIDES = ["-p", "cameras.topics:=[a,b]", "-p", "cameras.keys:=[base_0_rgb,left_wrist_0_rgb]",
             "-p", "cameras.compressed:=false", "-p", "control.horizon:=4"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tok.model", CFG.vocab_size)


def checkpoint(path, state_width=14):
    stats = {"observation.state": {"q01": -np.ones(state_width), "q99": np.ones(state_width)},
             "action": {"q01": -np.ones(14), "q99": np.ones(14)}}
    return save_checkpoint(build_model(CFG, seed=2), path, stats, embodiment="aloha")


def node_args(folder, tokenizer, *extra):
    tokenizer = ["-p", f"model.tokenizer:={tokenizer}"] if tokenizer else []
    return ["--ros-args", *ARMED, "-p", f"model.checkpoint:={folder}", *tokenizer, *OVERRIDES,
            *extra]


def test_truncated_weights_end_the_node_process_with_one_line(tmp_path, tokenizer, ros_env):
    folder = checkpoint(tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    child = Child(["-m", "oxygen_ros.nodes.vla_node", *node_args(folder, tokenizer)], ros_env)
    code, output = child.wait(timeout=120.0)
    assert code == 1, output
    lines = node_lines(output)
    assert len(lines) == 1, output
    assert "[FATAL]" in lines[0] and f"cannot start: model.checkpoint '{folder}' cannot be loaded: model.safetensors" \
        " (1000 bytes) is not a readable safetensors file" in lines[0], output


def _nan_weight(folder):
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.action_out_proj.weight"][0, 0] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"))


def _nan_stats(folder):
    stats_file = next(folder.glob("policy_*"))
    stats = load_file(str(stats_file))
    stats["action.q01"][3] = float("nan")
    save_file(stats, str(stats_file))


CORRUPT = {
    "empty weights": (lambda f: (f / "model.safetensors").write_bytes(b""),
                      "model.safetensors (0 bytes) is not a readable safetensors file"),
    "config of the wrong kind": (lambda f: (f / "config.json").write_text('"pi05"'),
                                 "config.json holds a JSON str, not a policy config object"),
    "nan weight": (_nan_weight, "model.safetensors holds NaN or infinite values: tensors (1): "
                                "model.action_out_proj.weight"),
    "nan stats": (_nan_stats, "normalization stat action.q01 in policy_preprocessor_step_0_normalizer_processor"
                              ".safetensors contains NaN or infinite values"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_each_corrupt_file_is_one_clear_start_up_error(case, tmp_path, tokenizer, capfd, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    corrupt, expected = CORRUPT[case]
    folder = checkpoint(tmp_path / "ckpt")
    corrupt(folder)
    assert vla_node_main(node_args(folder, tokenizer)) == 1
    err = capfd.readouterr().err
    assert f"cannot start: model.checkpoint '{folder}' cannot be loaded: {expected}" in err, err
    assert "Traceback" not in err and len(node_lines(err)) == 1, err


HUB_CASES = {  # model.checkpoint (and model.tokenizer) -> the line
    "uncached id": ("org/other", "", "model.checkpoint 'org/other' cannot be loaded: 'org/other' is not a folder; as a "
                                     "hub id: org/other is not in the hub cache at "),
    "not an id": ("no/such/folder", "", "'no/such/folder' is neither a checkpoint folder nor a hub repo id"),
    "revision not cached": ("org/tiny@v2", "", "org/tiny@v2 is not in the hub cache at {cache}/models--org--tiny "
                                               "(cached revisions: main)"),
    "no weights": ("org/config-only", "", "org/config-only has no model.safetensors"),
    "vocabulary": ("org/tiny", "small", "cannot start: model.tokenizer '{small}' cannot be used: the tokenizer {small} "
                                        "has 512 tokens, the checkpoint's vocabulary 1024"),
}


@pytest.mark.parametrize("case", sorted(HUB_CASES))
def test_hub_ids_that_cannot_be_used_are_one_start_up_line(case, tmp_path, hub_cache, capfd, monkeypatch):  # noqa: F811
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = checkpoint(tmp_path / "ckpt")
    cache_repo(hub_cache, "org/tiny", checkpoint_files(folder), "c" * 40)
    cache_repo(hub_cache, "org/config-only", {"config.json": (folder / "config.json")}, "c" * 40)
    small = train_tokenizer(tmp_path / "small.model", 512)
    source, tokenizer, expected = HUB_CASES[case]
    assert vla_node_main(node_args(source, small if tokenizer else "", "-p", "model.dtype:=float32")) == 1
    err = capfd.readouterr().err
    assert expected.format(cache=hub_cache, small=small) in err, err
    assert "Traceback" not in err and len(node_lines(err)) == 1, err


def test_stats_narrower_than_the_robot_stop_start_up(tmp_path, tokenizer, capfd, monkeypatch):
    # Loadable on its own (4 state dims), but the ALOHA file lists 14 state joints: every tick would fail.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = checkpoint(tmp_path / "ckpt", state_width=4)
    assert vla_node_main(node_args(folder, tokenizer)) == 1
    assert ("cannot start: joints.state_names gives 14 model dims, the checkpoint's normalization stats of "
            "observation.state only 4") in capfd.readouterr().err


def test_the_node_decodes_with_the_chosen_text_head_and_says_why(tmp_path, tokenizer, ros_domain_id, capfd,
                                                                  monkeypatch):
    import rclpy

    from oxygen_ros.nodes.vla_node import VlaNode

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = checkpoint(tmp_path / "ckpt")
    tensors = load_file(str(folder / "model.safetensors"))
    head = torch.randn(tensors[LM_HEAD].shape, generator=torch.Generator().manual_seed(1))
    tensors[LM_HEAD] = head  # a fine-tuned LeRobot file: lm_head kept, embedding moved
    save_file(tensors, str(folder / "model.safetensors"))
    for wanted, choice in (("auto", "lm_head"), ("embedding", "embedding")):
        context = rclpy.Context()
        rclpy.init(args=["vla_node", *node_args(folder, tokenizer, "-p", f"model.text_head:={wanted}")],
                   context=context, domain_id=ros_domain_id)
        node = VlaNode(context=context)
        try:
            assert node.autostart(), node.failure  # configure loads the model
            backbone = node.policy.model.backbone
            expected = head.to(backbone.text_head.dtype) if choice == "lm_head" else backbone.embed_tokens.weight
            assert torch.equal(backbone.text_head, expected)  # in the dtype `auto` chose
            assert f"text head {choice}: " in node.policy.source
        finally:
            node.close()
            node.destroy_node()
            context.try_shutdown()
            context.destroy()
        assert f"text head {choice}: " in capfd.readouterr().err
    assert vla_node_main(node_args(folder, tokenizer, "-p", "model.text_head:=output")) == 1
    assert "model.text_head must be one of auto | lm_head | embedding, got 'output'" in capfd.readouterr().err


def test_a_profile_the_checkpoint_was_not_trained_in_stops_start_up_unless_overridden(tmp_path, tokenizer, capfd,
                                                                                       ros_domain_id, monkeypatch):
    import rclpy

    from oxygen_ros.nodes.vla_node import VlaNode

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = checkpoint(tmp_path / "ckpt")  # trained in the aloha embodiment: deltas, pi's signs
    assert vla_node_main(node_args(folder, tokenizer, "-p", "embodiment:=absolute")) == 1
    err = capfd.readouterr().err
    assert ("cannot start: embodiment absolute does not fit model.checkpoint: the checkpoint was trained in "
            "embodiment aloha (set embodiment to the profile it was trained in, or embodiment_override: true)") in err
    assert len(node_lines(err)) == 1, err
    context = rclpy.Context()
    rclpy.init(args=["vla_node", *node_args(folder, tokenizer, "-p", "embodiment:=absolute",
                                            "-p", "embodiment_override:=true")], context=context,
               domain_id=ros_domain_id)
    node = VlaNode(context=context)
    try:
        assert node.autostart(), node.failure  # configured (the model loaded) and active, as its process would be
        assert "trained in embodiment aloha" in node.policy.embodiment_warning
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()
    assert "(starting: embodiment_override is true)" in capfd.readouterr().err


def base_checkpoint(path):
    """A checkpoint laid out as `lerobot/pi05_base` is: its pipelines' normalizers have no features and name no
    stats file, so the folder carries no statistics at all."""
    folder = save_checkpoint(build_model(CFG, seed=2), path, embodiment="aloha")
    for name, step in (("policy_preprocessor", "normalizer_processor"),
                       ("policy_postprocessor", "unnormalizer_processor")):
        config = {"eps": 1e-8, "features": {}, "norm_map": {"VISUAL": "IDENTITY", "STATE": "QUANTILES",
                                                            "ACTION": "QUANTILES"}}
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "steps": [
            {"registry_name": step, "config": config}]}))
    return folder


def dataset_stats(path, state_width=14, openpi=False):
    """The robot's own dataset stats: LeRobot's meta/stats.json (every statistic, images included), or openpi's
    norm_stats.json."""
    rng = np.random.default_rng(5)

    def feature(width):
        low = rng.uniform(-1.0, 0.0, width)
        return {"mean": (low + 0.5).tolist(), "std": [0.3] * width, "min": (low - 0.1).tolist(),
                "max": (low + 1.1).tolist(), "q01": low.tolist(), "q99": (low + 1.0).tolist(),
                "q10": (low + 0.1).tolist(), "q90": (low + 0.9).tolist()}

    if openpi:
        data = {"norm_stats": {"state": feature(state_width), "actions": feature(14)}}
    else:
        data = {"observation.state": {**feature(state_width), "count": [900]}, "action": feature(14),
                "observation.images.cam_high": {"mean": [[[0.4]], [[0.4]], [[0.4]]], "count": [900]}}
    path.write_text(json.dumps(data))
    return path


def test_a_checkpoint_without_stats_starts_with_the_users_stats(tmp_path, tokenizer, hub_cache, capfd, ros_domain_id,  # noqa: F811
                                                                monkeypatch):
    import rclpy

    from oxygen_ros.nodes.vla_node import VlaNode

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_repo(hub_cache, "org/base", checkpoint_files(base_checkpoint(tmp_path / "base")), "d" * 40)
    assert vla_node_main(node_args("org/base", tokenizer)) == 1
    err = capfd.readouterr().err
    assert "cannot start: model.checkpoint 'org/base' cannot be loaded: no normalization stats for observation.state" \
        in err and len(node_lines(err)) == 1, err
    for file, mode, convention in ((dataset_stats(tmp_path / "stats.json"), "", "QUANTILES"),
                                   (dataset_stats(tmp_path / "norm_stats.json", openpi=True), "MEAN_STD", "MEAN_STD")):
        context = rclpy.Context()
        modes = ["-p", f"model.norm_mode:={mode}"] if mode else []
        rclpy.init(args=["vla_node", *node_args("org/base", tokenizer, "-p", f"model.norm_stats:={file}", *modes)],
                   context=context, domain_id=ros_domain_id)
        node = VlaNode(context=context)
        try:
            assert node.autostart(), node.failure  # configured (the model loaded) and active
            norm = node.policy.norm_stats
            assert norm.modes == {"observation.state": convention, "action": convention}
            given = json.loads(file.read_text())
            state = given["norm_stats"]["state"] if "norm_stats" in given else given["observation.state"]
            np.testing.assert_array_equal(norm["observation.state"]["q01"], state["q01"])
            raw = np.asarray(state["mean"]) + 0.15
            q01, q99 = np.asarray(state["q01"]), np.asarray(state["q99"])
            # LeRobot's formulas (normalize_processor.py lines 349-362, 386-401), eps 1e-8 from the pipeline file
            expected = 2 * (raw - q01) / (q99 - q01) - 1 if not mode else 0.15 / (np.asarray(state["std"]) + 1e-8)
            np.testing.assert_allclose(norm.normalize("observation.state", raw), expected, atol=1e-6)
        finally:
            node.close()
            node.destroy_node()
            context.try_shutdown()
            context.destroy()


BAD_USER_STATS = {  # extra parameters -> the line
    "narrow": (lambda d: ["-p", f"model.norm_stats:={dataset_stats(d / 's.json', state_width=4)}"],
               "cannot start: joints.state_names gives 14 model dims, the checkpoint's normalization stats of "
               "observation.state only 4"),
    "wider than the model": (lambda d: ["-p", f"model.norm_stats:={dataset_stats(d / 's.json', state_width=40)}"],
                             "normalization stats of observation.state in {d}/s.json have width 40; the model's "
                             "state takes 1 to 16 dims"),  # the tiny model's
    "unknown mode": (lambda d: ["-p", "model.norm_mode:=ZSCORE"],
                     "cannot start: model.norm_mode must be empty (the checkpoint's) or one of MEAN_STD | MIN_MAX | "
                     "QUANTILES | QUANTILE10 | IDENTITY, got 'ZSCORE'"),
    "no such file": (lambda d: ["-p", f"model.norm_stats:={d}/none.json"], "the stats file {d}/none.json does not "
                                                                           "exist"),
    "mode without its stats": (lambda d: ["-p", f"model.norm_stats:={_only_quantiles(d)}",
                                          "-p", "model.norm_mode:=MEAN_STD"],
                               "lack mean and std (found q01, q99); its mode MEAN_STD needs mean and std"),
}


def _only_quantiles(folder):
    data = json.loads(dataset_stats(folder / "full.json").read_text())
    stats = {f: {k: v[k] for k in ("q01", "q99")} for f, v in data.items() if f != "observation.images.cam_high"}
    (folder / "q.json").write_text(json.dumps(stats))
    return folder / "q.json"


@pytest.mark.parametrize("case", sorted(BAD_USER_STATS))
def test_user_stats_that_do_not_fit_are_one_start_up_line(case, tmp_path, tokenizer, capfd, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = base_checkpoint(tmp_path / "base")
    extra, expected = BAD_USER_STATS[case]
    assert vla_node_main(node_args(folder, tokenizer, *extra(tmp_path))) == 1
    err = capfd.readouterr().err
    assert expected.format(d=tmp_path) in err, err
    assert "Traceback" not in err and len(node_lines(err)) == 1, err
