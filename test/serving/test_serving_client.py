"""The robot side of openpi's protocol (`serving/client.py`): the observation it sends is what the server's reader
takes back, and every reply it cannot act on is one counted `RemoteError` of its kind.

The far side is a real websocket server in this process speaking the protocol (`serving.protocol.pack`) with the
replies a broken, refusing, slow or partitioned engine sends; the engine's own replies are covered over DDS in
test_vla_node_remote.py."""

import threading
import time

import numpy as np
import pytest
from websockets.sync.server import serve

from oxygen_ros.control.embodiment import load_embodiment
from oxygen_ros.serving.client import (
    BAD_REPLY,
    FENCED,
    REFUSED,
    UNREACHABLE,
    RemoteEngine,
    RemoteError,
    openpi_observation,
)
from oxygen_ros.serving.protocol import pack, unpack
from oxygen_ros.serving.requests import RequestReader


@pytest.mark.parametrize("name", ["aloha", "droid", "absolute"])
def test_the_observation_sent_is_what_the_servers_reader_reads(name):
    profile = load_embodiment(name)
    rng = np.random.default_rng(0)
    width = profile.state_dims or 5
    state = rng.uniform(-1, 1, width)
    images = {model_key: rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for _, model_key in
              profile.openpi_keys.images}
    sent = unpack(pack(openpi_observation(profile.openpi_keys, images, state, "pick up the cube")))
    request = RequestReader(profile, (8, 32), 0, "").read(sent)
    np.testing.assert_allclose(request.state, state)
    assert request.observation.task == "pick up the cube"
    assert set(request.observation.images) == set(images)
    for key, image in images.items():
        np.testing.assert_array_equal(request.observation.images[key], image)


class Engine:
    """A websocket server that answers each request with the next reply of `replies` (bytes or text; a float:
    wait that long, then answer with the following one), its metadata `metadata`."""

    def __init__(self, metadata: dict, replies: list):
        self.metadata, self.replies, self.requests = metadata, list(replies), 0
        self.server = serve(self._connection, "127.0.0.1", 0, compression=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}/robots/r1"

    def _connection(self, ws) -> None:
        ws.send(pack(self.metadata))
        for _ in ws:
            self.requests += 1
            reply = self.replies.pop(0)
            if isinstance(reply, float):  # this request's reply comes late (the next request gets the one after)
                reply, late = self.replies.pop(0), reply
                time.sleep(late)
            ws.send(reply)


def chunk(epoch: int | None = None, replica: str = "replica0", value: float = 0.5) -> bytes:
    reply = {"actions": np.full((4, 3), value)}
    if epoch is not None:
        reply["placement"] = {"epoch": epoch, "replica": replica}
    return pack(reply)


def act(engine: RemoteEngine):
    return engine.act({"base_0_rgb": np.zeros((8, 8, 3), np.uint8)}, np.zeros(2), "task")


def test_refused_bad_and_late_replies_are_counted_errors_and_a_late_reply_never_answers_the_next_frame():
    keys = load_embodiment("absolute").openpi_keys
    server = Engine({"embodiment": "absolute"}, [
        chunk(), "the server refused the request (state_shape): ...", b"\xc1", pack({"actions": np.zeros((4, 1))}),
        pack([1, 2]), 1.5, chunk(value=9.0), chunk(value=1.0)])
    engine = RemoteEngine(server.url, None, keys, action_dims=2, timeout_s=0.5)
    try:
        first = act(engine)
        assert first.actions.shape == (4, 2) and first.placement is None and engine.pool is False
        for kind, words in ((REFUSED, "state_shape"), (BAD_REPLY, "not an openpi message"),
                            (BAD_REPLY, r"\[horizon, >= 2\]"), (BAD_REPLY, "a list of 2 items"),
                            (UNREACHABLE, "no reply within 0.5 s")):
            with pytest.raises(RemoteError, match=words) as error:
                act(engine)
            assert error.value.kind == kind
        # the late reply (9.0) went to the dropped connection; the next frame opens a new one and gets its own
        assert act(engine).actions.tolist() == [[1.0, 1.0]] * 4 and engine.connections == 2
        assert engine.failures == {REFUSED: 1, BAD_REPLY: 3, UNREACHABLE: 1} and engine.chunks == 2
    finally:
        engine.close()
        server.server.shutdown()
    with pytest.raises(RemoteError, match="cannot connect to") as error:
        act(engine)  # the server is gone
    assert error.value.kind == UNREACHABLE


def test_a_pools_replies_pass_the_robots_fence():
    keys = load_embodiment("absolute").openpi_keys
    server = Engine({"server": "pool", "replica": "replica0", "epoch": 3}, [
        chunk(3), chunk(4, "replica1"), chunk(3), chunk(4, "replica0"), chunk(), chunk(4, "replica1")])
    engine = RemoteEngine(server.url, "key", keys, action_dims=2, timeout_s=5.0)
    try:
        assert act(engine).placement == {"epoch": 3, "replica": "replica0"} and engine.pool
        assert act(engine).placement == {"epoch": 4, "replica": "replica1"}  # moved: the new owner
        for words in ("replica 'replica0' at epoch 3", "replica 'replica0' at epoch 4", "names no placement"):
            with pytest.raises(RemoteError, match=words) as error:
                act(engine)
            assert error.value.kind == FENCED
        assert act(engine).placement == {"epoch": 4, "replica": "replica1"}
        assert engine.counts()["fence_stale_epoch"] == 1 and engine.counts()["fence_other_replica"] == 1
        assert engine.counts()["fence_unfenced"] == 1 and engine.counts()["remote_fenced"] == 3
        assert engine.counts()["placement"] == "replica1@4"
    finally:
        engine.close()
        server.server.shutdown()
