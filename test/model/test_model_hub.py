"""Checkpoints and tokenizers named by hub id, resolved offline against a hub cache laid out by the test; the
tokenizer's resolution order; one-line errors for what cannot be resolved."""

import json

import pytest
import torch
from hub_fixtures import cache_repo, checkpoint_files, hub_cache, word_tokenizer_json  # noqa: F401 - fixture
from test_vla_node_units import parameter_values

from oxygen_ros.commands.cli import main as cli_main
from oxygen_ros.model.checkpoint import save_checkpoint
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.corpus import sentences
from oxygen_ros.model.hub import HubId, parse_hub_id
from oxygen_ros.model.loading import (
    PALIGEMMA_TOKENIZER,
    PALIGEMMA_VOCAB,
    checkpoint_folder,
    checkpoint_tokenizer,
    load_model_source,
)
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.tokenizer import train_tokenizer
from oxygen_ros.nodes.model_setup import load_policy
from oxygen_ros.nodes.parameters import read_parameters

CFG = get_preset("tiny")
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
STATS = {"observation.state": {"q01": -torch.ones(2).numpy(), "q99": torch.ones(2).numpy()},
         "action": {"q01": -torch.ones(2).numpy(), "q99": torch.ones(2).numpy()}}


@pytest.fixture
def repos(hub_cache, tmp_path):  # noqa: F811 - the fixture
    """org/tiny: main -> a checkpoint of seed 2 carrying its tokenizer, v1 -> seed 3 without one; org/tok: a
    tokenizer repo (a tokenizer.json); org/noweights: a repo without model.safetensors."""
    tokenizer = train_tokenizer(tmp_path / "tok.model", CFG.vocab_size)
    seeds = {}
    for commit, seed, refs in ((COMMIT_A, 2, ("main",)), (COMMIT_B, 3, ("v1",))):
        folder = save_checkpoint(build_model(CFG, seed=seed), tmp_path / f"ckpt{seed}", STATS)
        if seed == 2:
            (folder / "tokenizer.model").write_bytes(tokenizer.read_bytes())
        cache_repo(hub_cache, "org/tiny", checkpoint_files(folder), commit, refs)
        seeds[commit] = seed
    cache_repo(hub_cache, "org/tok", {"tokenizer.json": word_tokenizer_json(tmp_path / "tj.json", CFG.vocab_size)},
               COMMIT_A)
    cache_repo(hub_cache, "org/noweights", {"config.json": b"{}"}, COMMIT_A)
    return seeds


def weights_of(seed: int) -> torch.Tensor:
    return build_model(CFG, seed=seed).action_out_proj.weight


def test_hub_ids_parse_and_paths_do_not():
    assert parse_hub_id("lerobot/pi05_base") == HubId("lerobot/pi05_base")
    assert parse_hub_id("lerobot/pi05_base@v1.0") == HubId("lerobot/pi05_base", "v1.0")
    for not_an_id in ("pi05", "/abs/folder", "./org/name", "a/b/c", "org/name@", "org/na me", "org--x/y"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_an_id_resolves_to_its_cached_snapshot_and_a_revision_picks_its_own(repos, hub_cache):  # noqa: F811
    for source, commit in (("org/tiny", COMMIT_A), ("org/tiny@v1", COMMIT_B), (f"org/tiny@{COMMIT_A}", COMMIT_A)):
        folder = checkpoint_folder(source)
        assert folder == hub_cache.resolve() / "models--org--tiny" / "snapshots" / commit
        loaded = load_model_source(source, "cpu", torch.float32)
        assert torch.equal(loaded.model.action_out_proj.weight, weights_of(repos[commit])), source
        assert loaded.description.startswith(f"checkpoint {source} ({folder})")
    # The node: the tokenizer the snapshot carries is found without model.tokenizer.
    params = read_parameters(parameter_values(model__checkpoint="org/tiny", model__cpu_kernel="off",
                                              model__dtype="float32"))
    policy = load_policy(params)
    assert torch.equal(policy.model.action_out_proj.weight, weights_of(2))
    assert f"tokenizer {hub_cache.resolve()}/models--org--tiny/snapshots/{COMMIT_A}/tokenizer.model" in policy.source


@pytest.mark.parametrize("source, expected", [
    ("org/missing", "org/missing is not in the hub cache at {cache}/models--org--missing and the hub is offline "
                    "(HF_HUB_OFFLINE=1): run `oxygen-ros download org/missing` on a machine with network"),
    ("org/tiny@v9", "org/tiny@v9 is not in the hub cache at {cache}/models--org--tiny (cached revisions: main, v1) "
                    "and the hub is offline (HF_HUB_OFFLINE=1): run `oxygen-ros download org/tiny --revision v9`"),
    ("no/such/folder", "'no/such/folder' is neither a checkpoint folder nor a hub repo id (org/name or "
                       "org/name@revision)"),
    ("org/noweights", "org/noweights has no model.safetensors (snapshot {cache}/models--org--noweights/snapshots/"
                      f"{COMMIT_A}): not a pi05 PyTorch checkpoint"),
])
def test_what_cannot_be_resolved_is_one_line(repos, hub_cache, source, expected):  # noqa: F811
    with pytest.raises(ValueError) as raised:
        checkpoint_folder(source)
    message = str(raised.value)
    assert expected.format(cache=hub_cache.resolve() if "snapshot" in expected else hub_cache) in message, message
    assert "\n" not in message


def test_tokenizer_resolution_order_and_vocabulary(repos, hub_cache, tmp_path):  # noqa: F811
    main = checkpoint_folder("org/tiny")  # carries tokenizer.model
    other = train_tokenizer(tmp_path / "other.model", CFG.vocab_size)
    # 1. what the user names wins: a file, or a hub id (a tokenizer.json, read with `tokenizers`)
    assert checkpoint_tokenizer(main, CFG.vocab_size, str(other))[1] == str(other)
    tokenizer, where = checkpoint_tokenizer(main, CFG.vocab_size, "org/tok")
    assert where.endswith(f"models--org--tok/snapshots/{COMMIT_A}/tokenizer.json")
    text = " ".join(next(iter(sentences())).split())
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # 2. the checkpoint's own file
    assert checkpoint_tokenizer(main, CFG.vocab_size)[1] == str(main / "tokenizer.model")
    # 3. LeRobot's saved artifact (tokenizer/tokenizer.json), then the repo its preprocessor names
    folder = save_checkpoint(build_model(CFG, seed=2), tmp_path / "lerobot", STATS)
    word_tokenizer_json(folder / "tokenizer" / "tokenizer.json", CFG.vocab_size)
    assert checkpoint_tokenizer(folder, CFG.vocab_size)[1] == str(folder / "tokenizer" / "tokenizer.json")
    (folder / "tokenizer" / "tokenizer.json").unlink()
    steps = [{"registry_name": "tokenizer_processor", "config": {"tokenizer_name": "org/tok", "max_length": 48}}]
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    assert "models--org--tok" in checkpoint_tokenizer(folder, CFG.vocab_size)[1]
    # 4. nothing carried or named: PaliGemma's vocabulary falls back to LeRobot's tokenizer repo, others stop
    (folder / "policy_preprocessor.json").unlink()
    with pytest.raises(ValueError, match=f"{PALIGEMMA_TOKENIZER} is not in the hub cache"):
        checkpoint_tokenizer(folder, PALIGEMMA_VOCAB)
    with pytest.raises(ValueError, match=f"carries no tokenizer .* its vocabulary \\({CFG.vocab_size} tokens\\) is "
                                         "not PaliGemma's: set model.tokenizer"):
        checkpoint_tokenizer(folder, CFG.vocab_size)
    # A tokenizer of another vocabulary than the checkpoint's is refused, wherever it was found.
    cache_repo(hub_cache, PALIGEMMA_TOKENIZER, {"tokenizer.model": other}, COMMIT_A)
    with pytest.raises(ValueError, match=f"has {CFG.vocab_size} tokens, the checkpoint's vocabulary "
                                         f"{PALIGEMMA_VOCAB}: it is not the tokenizer the checkpoint was trained with"):
        checkpoint_tokenizer(folder, PALIGEMMA_VOCAB)
    small = train_tokenizer(tmp_path / "small.model", 512)
    with pytest.raises(ValueError, match="has 512 tokens, the checkpoint's vocabulary 1024"):
        checkpoint_tokenizer(main, CFG.vocab_size, str(small))


def test_download_prints_the_parameter_lines_and_fails_in_one_line(repos, hub_cache, capsys):  # noqa: F811
    assert cli_main(["download", "org/tiny", "--revision", "main"]) == 0
    out = capsys.readouterr().out
    snapshot = hub_cache.resolve() / "models--org--tiny" / "snapshots" / COMMIT_A
    assert f"checkpoint org/tiny@main: {snapshot} (weights " in out
    assert f"tokenizer: {snapshot}/tokenizer.model (1024 tokens)" in out
    assert '      checkpoint: "org/tiny@main"\n      tokenizer: ""  # empty: found as above' in out
    assert cli_main(["download", "org/tiny@v1", "--tokenizer", "org/tok"]) == 0
    assert '      checkpoint: "org/tiny@v1"\n      tokenizer: "org/tok"\n' in capsys.readouterr().out
    assert cli_main(["download", "org/missing"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("oxygen-ros download: error: 'org/missing' is not a folder; as a hub id: org/missing is "
                          "not in the hub cache") and "\n" not in err
    assert cli_main(["download", "./folder"]) == 2


def test_download_of_a_checkpoint_without_stats_says_what_is_missing(hub_cache, tmp_path, capsys):  # noqa: F811
    from test_vla_node_checkpoint_startup import base_checkpoint, dataset_stats

    folder = base_checkpoint(tmp_path / "base")  # laid out as lerobot/pi05_base: normalizers without stats
    train_tokenizer(folder / "tokenizer.model", CFG.vocab_size)
    cache_repo(hub_cache, "org/base", checkpoint_files(folder), COMMIT_A)
    assert cli_main(["download", "org/base"]) == 1
    captured = capsys.readouterr()
    assert "tokenizer: " in captured.out  # what could be checked was
    err = captured.err.strip()
    assert err == ("oxygen-ros download: error: org/base cannot run without normalization stats: no normalization "
                   "stats for observation.state in the folder (no policy_*normalizer_processor.safetensors, processor "
                   "pipeline JSON naming one, or normalization buffers in model.safetensors). Give the stats of the "
                   "robot's own dataset (LeRobot's meta/stats.json or openpi's norm_stats.json): --norm-stats here, "
                   "model.norm_stats on the node"), err
    stats = dataset_stats(tmp_path / "stats.json")
    assert cli_main(["download", "org/base", "--norm-stats", str(stats)]) == 0
    out = capsys.readouterr().out
    assert (f"normalization: observation.state QUANTILES, action QUANTILES (lerobot's formulas, eps 1e-08), stats "
            f"from {stats}") in out
    assert f'      norm_stats: "{stats}"\n' in out
