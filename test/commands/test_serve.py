"""`oxygen-ros serve` with the real `openpi-client` (`WebsocketClientPolicy`): one server process for this module,
on a tiny checkpoint in the aloha embodiment (config/aloha.yaml), with an API key from the environment and a cap
of three clients.

The DROID profile's proof (the node's positions are the frame's state plus the integrated velocities the server
returns) runs beside the DROID node over DDS in test_vla_node_embodiment.py."""

import json
import os
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from sensor_msgs.msg import JointState
from serve_process import REPO, ServeProcess
from test_vla_node_units import RGB, Published, aloha_checkpoint, aloha_node, decoded, image
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_ros.commands.serve import API_KEY_ENV
from oxygen_ros.nodes.conversions import ns_to_stamp

pytestmark = pytest.mark.system
KEY = "key-from-the-environment-5f3a"  # in no other text the server prints
MAX_CLIENTS = 3
HORIZON, ACTION_DIM = 8, 16  # the tiny preset's
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the server process, its checkpoint folder)."""
    folder = tmp_path_factory.mktemp("serve_aloha")
    checkpoint, tokenizer = aloha_checkpoint(folder)
    server = ServeProcess("--checkpoint", str(checkpoint), "--tokenizer", str(tokenizer),
                          "--params-file", str(REPO / "config" / "aloha.yaml"), "-p", "model.dtype=float32",
                          "-p", "model.cpu_kernel=off", "-p", "language.max_new_tokens=4",
                          "--max-clients", str(MAX_CLIENTS), "--max-message-mb", "8", "--slo-ms", "60000",
                          env={**os.environ, API_KEY_ENV: KEY})
    try:
        server.wait_ready()
        yield server, folder
    finally:
        rc, output = server.stop()
    assert rc == 0, output


def client(server: ServeProcess, key: str | None = KEY) -> WebsocketClientPolicy:
    return WebsocketClientPolicy("127.0.0.1", server.port, api_key=key)


@contextmanager
def clients(server: ServeProcess, count: int):
    """`count` clients, disconnected at the end (the server serves three at once)."""
    made = [client(server) for _ in range(count)]
    try:
        yield made
    finally:
        for policy in made:
            policy._ws.close()  # the client has no close(); its connection does


def noise(draw: int) -> np.ndarray:
    """The `draw`-th noise of a runtime seeded 0 (what vla_node with model.seed 0 uses for its draw-th frame)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(draw + 1):
        sample = torch.randn(1, HORIZON, ACTION_DIM, generator=generator)
    return sample[0].numpy()


def request(state: np.ndarray, prompt: str = "", draw: int = 0, **extra) -> dict:
    chw = RGB.transpose(2, 0, 1)
    return {"state": state, "images": {"cam_high": chw, "cam_left_wrist": chw}, "prompt": prompt,
            "noise": noise(draw), **extra}


def test_metadata_and_actions_are_what_vla_node_commands(served, ros_domain_id):
    """Metadata on connect; for the same images, state, prompt and noise, the reply's actions are the chunk the
    VLA node (in this process, on the same checkpoint and config/aloha.yaml) commands: the model's deltas added to
    the state and encoded back to ALOHA's convention."""
    server, folder = served
    state = np.linspace(-0.5, 0.5, 14)
    with clients(server, 1) as (policy,):
        metadata = policy.get_server_metadata()
        reply = policy.infer(request(state))
        second = policy.infer(request(state))
    assert metadata["reset_pose"] == [0, -1.5, 1.5, 0, 0, 0] and metadata["embodiment"] == "aloha"
    assert (metadata["action_horizon"], metadata["action_dim"]) == (HORIZON, 14)
    actions = reply["actions"]
    assert actions.shape == (HORIZON, 14) and np.isfinite(actions).all()
    assert reply["policy_timing"]["infer_ms"] > 0 and reply["server_timing"]["infer_ms"] > 0
    assert "prev_total_ms" in second["server_timing"]  # from the second request on

    node, context = aloha_node(folder, ros_domain_id, "model.dtype:=float32")
    try:
        now = node.get_clock().now().nanoseconds
        for index in range(2):
            node._on_image(index, image("rgb8", RGB, stamp_ns=now))
        joints = JointState(name=list(node.params.state_names), position=state.tolist())
        joints.header.stamp = ns_to_stamp(now)
        node._on_joint_state(joints)
        decoded(node)
        node.chunk_pub = published = Published()
        node._control_tick()  # its first frame: noise draw 0
        assert node.actions_published == 1, node.detail
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()
    commanded = np.array([p.positions for p in published[0].points])
    assert commanded.shape == (4, 14)  # the test node's control.horizon
    np.testing.assert_allclose(actions[:4], commanded, atol=1e-5)
    assert np.abs(actions - state).max() > 1e-3  # not the state itself: the model's deltas are in it


def test_two_clients_at_once_get_their_own_answers_and_narration_reaches_the_asker(served):
    server, _ = served
    with clients(server, 2) as (first, second):
        two_clients(first, second)


def two_clients(first: WebsocketClientPolicy, second: WebsocketClientPolicy) -> None:
    asks = [request(np.linspace(-0.5, 0.5, 14), "pick up the cube", draw=1, narrate=True),
            request(np.linspace(0.4, -0.3, 14), "open the drawer", draw=2)]
    alone = [first.infer(dict(asks[0], narrate=False))["actions"], second.infer(asks[1])["actions"]]
    assert np.abs(alone[0] - alone[1]).max() > 1e-3
    replies: list[list[dict]] = [[], []]
    start = threading.Barrier(2)

    def run(policy, ask, out):
        for _ in range(4):
            start.wait()  # both requests in flight together: batched when they meet in the queue
            out.append(policy.infer(ask))

    threads = [threading.Thread(target=run, args=(p, a, o)) for p, a, o in zip((first, second), asks, replies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    for own, out in zip(alone, replies):
        assert len(out) == 4
        for reply in out:
            np.testing.assert_allclose(reply["actions"], own, atol=1e-4)
    # the narrations of the first client's four narrating requests come back to it, in later replies
    narrations = [n for r in replies[0] for n in r.get("narration", [])]
    deadline = time.monotonic() + TIMEOUT_S
    while len(narrations) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
        narrations += first.infer(dict(asks[0], narrate=False)).get("narration", [])
    assert sorted(n["request"] for n in narrations) == [1, 2, 3, 4]  # its requests 1..4 narrated (0 did not)
    assert all(1 <= n["tokens"] <= 4 and isinstance(n["text"], str) for n in narrations)
    newest = first.infer(dict(asks[0], narrate=False, newest_narration=True))
    assert "narration" not in newest and newest["newest_narration"]["request"] in (1, 2, 3, 4)
    later = second.infer(asks[1])
    assert not any("narration" in r for r in replies[1] + [later])  # the other client never asked, never gets any


def raw(server: ServeProcess):
    """A plain websocket connection with the key (for bytes the real client cannot send); metadata read."""
    ws = websockets.sync.client.connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None,
                                        additional_headers={"Authorization": f"Api-Key {KEY}"})
    msgpack_numpy.unpackb(ws.recv())
    return ws


def test_bad_input_is_a_clear_error_to_its_client_and_everyone_else_is_served(served):
    server, _ = served
    with clients(server, 1) as (good,):
        bad_inputs(server, good)
    assert server.alive()
    log = server.output
    for reason in ("missing_key", "image_shape", "image_dtype", "nonfinite_state", "state_shape", "noise",
                   "malformed", "text_message", "too_big"):
        assert f"refused a request ({reason})" in log, (reason, log)
    assert log.count("refused a request (missing_key)") == 1  # three of them, logged once
    assert "refused {'missing_key': 3," in log  # the bad client's summary when it left
    assert log.count("clients already connected") == 1


def bad_inputs(server: ServeProcess, good: WebsocketClientPolicy) -> None:
    bad = client(server)
    ask = request(np.linspace(-0.5, 0.5, 14), "pick", draw=3)
    expected = good.infer(ask)["actions"]
    hwc_images = dict(ask, images={"cam_high": RGB})
    cases = {
        "missing key 'state'": {k: v for k, v in ask.items() if k != "state"},
        "missing key 'images/cam_high'": dict(ask, images={"cam_left_wrist": RGB.transpose(2, 0, 1)}),
        "image images/cam_high must be 3 x height x width": hwc_images,
        "image images/cam_high must be a uint8 array": dict(ask, images={"cam_high": RGB.transpose(2, 0, 1)
                                                                        .astype(np.int16)}),
        "the state holds NaN": dict(ask, state=np.full(14, np.nan)),
        "state must hold 14 values": dict(ask, state=np.zeros(3)),
        "noise must be a float array of shape": dict(ask, noise=np.zeros((2, 2))),
    }
    for message, obs in cases.items():
        with pytest.raises(RuntimeError, match="Error in inference server:\noxygen-ros serve refused the request "
                                               rf"\(\w+\): {message}"):
            bad.infer(obs)
        np.testing.assert_allclose(good.infer(ask)["actions"], expected, atol=1e-5)
    # the same kind twice is logged once
    with pytest.raises(RuntimeError, match="missing key 'state'"):
        bad.infer(cases["missing key 'state'"])
    np.testing.assert_allclose(bad.infer(ask)["actions"], expected, atol=1e-5)  # and the bad client is served too
    bad._ws.close()

    ws = raw(server)  # a malformed msgpack message, then a text message
    ws.send(b"\xc1 not msgpack")
    assert ws.recv().startswith("oxygen-ros serve refused the request (malformed): not a msgpack message")
    ws.send("hello")
    assert "(text_message)" in ws.recv()
    ws.send(msgpack_numpy.packb(ask))  # the connection goes on after errors
    np.testing.assert_allclose(msgpack_numpy.unpackb(ws.recv())["actions"], expected, atol=1e-5)
    ws.send(msgpack_numpy.packb(dict(ask, narrate=True)))  # ... and its client leaves mid-request
    ws.close()

    big = client(server)  # a 100 MB message closes its connection (the limit is 8 MB here), nothing else
    with pytest.raises(ConnectionClosed, match="1009"):
        big.infer(dict(ask, state=np.zeros(100 * 2**20 // 8)))
    np.testing.assert_allclose(good.infer(ask)["actions"], expected, atol=1e-5)

    outcomes: list[str] = []  # 50 clients at once: two slots are free (good holds one), the rest are refused
    lock, everyone_tried = threading.Lock(), threading.Event()

    def connect():
        policy = None
        try:
            policy = client(server)
            outcome = "served" if np.isfinite(policy.infer(ask)["actions"]).all() else "nonfinite"
        except InvalidStatus as err:
            outcome = str(err.response.status_code)
        except ConnectionClosed as err:  # two raced for one slot: closed with 1013 (try again later)
            outcome = str(err.rcvd.code if err.rcvd else "closed")
        with lock:
            outcomes.append(outcome)
            if len(outcomes) == 50:
                everyone_tried.set()
        if policy is not None:
            everyone_tried.wait(TIMEOUT_S)  # hold the slot until every other client has tried
            policy._ws.close()

    crowd = [threading.Thread(target=connect) for _ in range(50)]
    for thread in crowd:
        thread.start()
    for thread in crowd:
        thread.join(TIMEOUT_S)
    assert len(outcomes) == 50 and set(outcomes) <= {"served", "503", "1013"}, outcomes
    assert 1 <= outcomes.count("served") <= MAX_CLIENTS - 1, outcomes
    np.testing.assert_allclose(good.infer(ask)["actions"], expected, atol=1e-5)


def test_the_environments_api_key_is_required_the_right_one_served_and_the_key_never_printed(served):
    """The server was given its key only through the environment (no --api-key)."""
    server, _ = served
    for key in (None, "wrong"):
        with pytest.raises(InvalidStatus, match="HTTP 401"):
            client(server, key)
    with clients(server, 1) as (policy,):
        assert policy.infer(request(np.zeros(14)))["actions"].shape == (HORIZON, 14)
    assert server.output.count("API key (further refusals from this host") == 1
    assert "(API key required;" in server.output and KEY not in server.output


def test_serve_bench_runs_its_settings_side_by_side(tmp_path, capsys):
    """`oxygen-ros serve-bench`, shortened: a server in this process, client processes, the sequential baseline."""
    from oxygen_ros.commands import serve_bench

    assert serve_bench.main(["--presets", "tiny", "--clients", "2", "--seconds", "0.5", "--rounds", "1",
                             "--out", str(tmp_path / "bench")]) == 0
    records = {r["setting"]: r for r in json.loads((tmp_path / "bench" / "serve_bench.json").read_text())}
    assert sorted(records) == ["probe", "sequential", "serve 2"]
    # the baseline at its own best: a process of its own with libgomp's own waits, as one torch thread wants, not
    # the sleeping waits of the server's process
    assert records["sequential"]["pid"] != os.getpid()
    assert records["sequential"]["openmp"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}
    assert all(r["requests_per_s"] > 0 for r in records.values())
    assert records["serve 2"]["requests"] >= 2 and records["serve 2"]["overhead_p50_ms"] > 0
    assert "| tiny | serve 2 |" in capsys.readouterr().out


def test_real_time_chunking_keys_guide_the_next_chunk_and_a_plain_client_never_sees_them(served):
    """A client of the real `openpi-client` that sends `rtc_executed` and `rtc_delay` gets a chunk whose first
    `rtc_delay` actions follow the rest of its previous reply (kept on the server per connection, in the model's
    space; ALOHA's deltas re-based onto the new state); the same request without them is sampled plainly and jumps.
    Numbers the guide cannot use (a delay at the horizon, a place past the previous chunk) are sampled plainly,
    counted, logged and named in the reply; a value that is not a whole number is refused. A reply to a request
    without the keys has no `rtc` key: openpi's clients see nothing new."""
    server, _ = served
    state = np.linspace(-0.5, 0.5, 14)
    moved = state + 0.05  # the robot moved between the two observations
    with clients(server, 1) as (policy,):
        first = policy.infer(request(state, draw=0))
        guided = policy.infer(request(moved, draw=1, rtc_executed=2, rtc_delay=3))
        policy.infer(request(state, draw=0))  # the previous chunk again
        plain = policy.infer(request(moved, draw=1))
        late = policy.infer(request(moved, draw=1, rtc_executed=1, rtc_delay=HORIZON))
        past = policy.infer(request(moved, draw=1, rtc_executed=HORIZON, rtc_delay=1))
        with pytest.raises(RuntimeError, match=r"refused the request \(rtc\): rtc_delay must be a whole number"):
            policy.infer(request(moved, rtc_executed=1, rtc_delay=1.5))
        with pytest.raises(RuntimeError, match="rtc_executed and rtc_delay go together"):
            policy.infer(request(moved, rtc_delay=1))
    assert "rtc" not in first and "rtc" not in plain
    assert guided["rtc"] == "guided"
    assert late["rtc"].startswith("plain (delay): delay 8 is at or beyond the execution horizon 8")
    assert past["rtc"].startswith("plain (past)")
    committed = first["actions"][2:5]  # the actions the robot executes while the new chunk is computed
    guided_gap = np.abs(guided["actions"][:3] - committed).max()
    plain_gap = np.abs(plain["actions"][:3] - committed).max()
    assert guided_gap < 0.25 * plain_gap, (guided_gap, plain_gap)
    log = server.output
    assert "real-time chunking not applied (delay)" in log and "real-time chunking not applied (past)" in log
    assert "refused a request (rtc)" in log
