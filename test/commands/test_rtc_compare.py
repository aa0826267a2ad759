"""`rtc-compare`: the hand-overs under a delay side by side on gym-aloha, each cell a real `sim-eval` in process
(MuJoCo physics, the checkpoint's model) on the same seeds; training-time RTC's cell samples a checkpoint trained
with `--rtc-max-delay` by the prefix method; a run cut short resumes from the cells already written."""

import json

import pytest
from test_train_tiny import dataset  # noqa: F401 (fixture)

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands import rtc_compare
from oxygen_ros.commands.train_tiny import main as train_main

pytestmark = pytest.mark.system  # MuJoCo physics

CELLS = ["newest_wins", "temporal_ensemble", "rtc_blend", "rtc_guided", "rtc_prefix"]


@pytest.fixture(scope="module")
def checkpoints(dataset, tmp_path_factory):  # noqa: F811
    root, _ = dataset
    folder = tmp_path_factory.mktemp("rtc_compare")
    plain, prefix = folder / "plain", folder / "prefix"
    assert train_main([str(root), str(plain), "--steps", "2", "--batch-size", "2"]) == 0
    assert train_main([str(root), str(prefix), "--steps", "2", "--batch-size", "2", "--rtc-max-delay", "3"]) == 0
    return plain, prefix


def test_every_hand_over_on_the_same_seeds_and_a_resumable_table(checkpoints, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    plain, prefix = checkpoints
    args = [str(plain), "--prefix-checkpoint", str(prefix), "--delays", "2", "--episodes", "2", "--steps", "10",
            "--seed", "7", "--out", str(tmp_path)]
    assert rtc_compare.main(args) == 0
    results = {c: json.loads((tmp_path / f"{c}_d2" / "sim_eval.json").read_text()) for c in CELLS}
    assert all(r["seeds"] == [7, 8] and r["delay"] == 2 and r["trials"] == 2 for r in results.values())
    assert [results[c]["handover"] for c in CELLS] == ["newest_wins", "temporal_ensemble", "rtc", "rtc_guided",
                                                       "rtc_guided"]
    assert results["rtc_guided"]["checkpoint"] == str(plain) and results["rtc_guided"]["rtc_method"] == "guidance"
    assert results["rtc_prefix"]["checkpoint"] == str(prefix) and results["rtc_prefix"]["rtc_method"] == "prefix"
    for cell in ("rtc_guided", "rtc_prefix"):  # frames after the first chunk's arrival were sampled toward it
        assert results[cell]["rtc"]["rtc_guided"] >= 1, results[cell]["rtc"]
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(CELLS) and capsys.readouterr().out.splitlines()[-len(table):] == table
    for line, cell in zip(table[2:], CELLS):
        assert line.startswith(f"| 2 | {cell} | {results[cell]['successes']}/2 ")
    # run again: every cell is read back, none evaluated
    monkeypatch.setattr(rtc_compare.sim_eval, "main", lambda argv: pytest.fail(f"ran again: {argv}"))
    assert rtc_compare.main(args) == 0
    assert (tmp_path / "table.md").read_text().splitlines() == table
    # a subset of the cells (the table keeps its order); the prefix cell needs its checkpoint
    assert rtc_compare.main(args[:1] + args[3:] + ["--cells", "rtc_guided", "newest_wins"]) == 0
    assert (tmp_path / "table.md").read_text().splitlines()[2:] == [table[2], table[5]]
    with pytest.raises(UsageError, match="needs --prefix-checkpoint"):
        rtc_compare.main(args[:1] + args[3:] + ["--cells", "rtc_prefix"])
    # a cell written for other seeds is not mixed into the table
    assert rtc_compare.main(args[:-3] + ["8", "--out", str(tmp_path)]) == 1
    assert "evaluated seeds [7, 8]" in capsys.readouterr().err
