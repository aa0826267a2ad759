"""A recorded sim episode is a real ALOHA file: it reads back through the data layer and converts to a bag."""

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from oxygen_ros.data.aloha import read_aloha  # noqa: E402
from oxygen_ros.data.bag import bag_topics  # noqa: E402
from oxygen_ros.data.convert import main as convert_main  # noqa: E402
from oxygen_ros.sim.aloha_env import AlohaSimEnv  # noqa: E402
from oxygen_ros.sim.recording import EpisodeRecorder, next_episode_path  # noqa: E402

pytestmark = pytest.mark.system  # episodes come from the MuJoCo simulator


@pytest.mark.parametrize("compress", [False, True])
def test_recorded_episode_reads_back_and_converts(tmp_path, compress):
    env = AlohaSimEnv("transfer_cube", cameras=("top", "left_wrist"), height=48, width=64)
    recorder = EpisodeRecorder(env.cameras, task=env.instruction)
    try:
        obs = env.reset(seed=2)
        actions = []
        for t in range(12):
            action = obs.qpos + 0.01 * t
            recorder.add(obs.images, obs.qpos, obs.qvel, action)
            actions.append(action)
            obs = env.step(action).observation
    finally:
        env.close()
    path = recorder.write(next_episode_path(tmp_path / "rec"), compress=compress)
    assert path.name == "episode_0.hdf5" and next_episode_path(tmp_path / "rec").name == "episode_1.hdf5"

    episode = read_aloha(path)
    assert episode.length == 12 and set(episode.cameras) == {"top", "left_wrist"}
    assert episode.images["top"].shape == (12, 48, 64, 3)
    np.testing.assert_allclose(episode.actions, np.array(actions, dtype=np.float32))
    assert episode.joint_names[0] == "left_waist" and episode.velocity is not None
    if not compress:
        np.testing.assert_array_equal(episode.images["top"][0], recorder.episode().images["top"][0])

    bag = tmp_path / "bag"
    assert convert_main(["aloha", str(path), str(bag), "--task", "sim"]) == 0
    topics = {t.name: t.count for t in bag_topics(bag)}
    assert topics["camera/top/image_raw"] == 12 and topics["joint_states"] == 12


def test_recorder_rejects_missing_cameras_and_empty_episodes():
    recorder = EpisodeRecorder(("top",))
    with pytest.raises(ValueError, match="nothing recorded"):
        recorder.episode()
    with pytest.raises(ValueError, match="lacks cameras"):
        recorder.add({}, np.zeros(14), np.zeros(14), np.zeros(14))
