"""`oxygen-ros serve`'s requests on the engine's path, in this process: a server built as the command builds it
(`commands.serve.build_server`, the tiny preset in the droid profile) and the real `openpi-client` against it.

What these tests need to happen at the same time is made to happen by holding the control path (the runtime's
control step or the runner's act waits for an event), never by hoping that the machine is fast or slow: requests of
two clients batched together, a request whose deadline passes while it is queued. And a client that never asks for
text is watched for any language work it could cause."""

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from oxygen_ros.commands.bench_client import droid_request
from oxygen_ros.commands.serve import MODEL_ID, Capacity, build_server
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.serving.params import engine_parameters
from oxygen_ros.serving.server import ServeConfig

pytestmark = pytest.mark.system  # serves websocket clients on the wall clock
TIMEOUT_S = 120.0
HORIZON, ACTION_DIM = 8, 16  # the tiny preset's


@contextmanager
def serving(max_clients: int, max_batch: int, slo_s: float):
    """A started server on a free port, and its clients' connections: closed at the end."""
    p = engine_parameters([], ["embodiment=droid", "model.dtype=float32", "model.cpu_kernel=off",
                               "language.max_new_tokens=4"])
    server = build_server(p, ServeConfig(port=0), Capacity(max_clients, max_batch, slo_s)).start()
    policies: list[WebsocketClientPolicy] = []

    def connect() -> WebsocketClientPolicy:
        policies.append(WebsocketClientPolicy("127.0.0.1", server.port))
        return policies[-1]

    try:
        yield server, connect
    finally:
        for policy in policies:
            policy._ws.close()  # openpi-client has no close(); its connection does
        server.close()


def ask(seed: int, prompt: str, **extra) -> dict:
    """DROID's request (32 x 32 images) with its own flow-matching noise, so its answer is repeatable."""
    noise = np.random.default_rng(100 + seed).normal(size=(HORIZON, ACTION_DIM)).astype(np.float32)
    return {**droid_request(seed, size=32), "prompt": prompt, "noise": noise, **extra}


class Background:
    """One call on its own thread: its result, or the exception it raised."""

    def __init__(self, call):
        self.result = self.error = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call) -> None:
        try:
            self.result = call()
        except Exception as error:  # handed to the test, which asserts on it
            self.error = error

    def join(self):
        self._thread.join(TIMEOUT_S)
        assert not self._thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def test_requests_of_two_clients_meet_in_one_batch_and_each_gets_its_own_answer(monkeypatch):
    """The control step is held until both clients' requests are queued: the one batch that then runs holds both
    (the scheduler's log of jobs says so), and each client gets the actions it gets when served alone."""
    with serving(max_clients=2, max_batch=2, slo_s=60.0) as (server, connect):
        runtime = server.fleet.runtime
        first, second = connect(), connect()
        asks = [ask(0, "put the marker in the cup"), ask(1, "open the drawer")]
        alone = [first.infer(asks[0])["actions"], second.infer(asks[1])["actions"]]
        assert np.abs(alone[0] - alone[1]).max() > 1e-3  # different questions, different answers

        both_queued = threading.Event()
        submit, step = runtime.submit, runtime.control.step

        def counting_submit(frame):
            queued = submit(frame)
            if runtime.frames_pending() == 2:
                both_queued.set()
            return queued

        def held_step():
            both_queued.wait(TIMEOUT_S)
            return step()

        monkeypatch.setattr(runtime, "submit", counting_submit)
        monkeypatch.setattr(runtime.control, "step", held_step)
        runtime.scheduler.log = []  # from here on the scheduler keeps every finished job
        calls = [Background(lambda: first.infer(asks[0])), Background(lambda: second.infer(asks[1]))]
        together = [call.join()["actions"] for call in calls]

        assert both_queued.is_set()
        batches = [[frame.robot_id for frame in batch.frames] for job in runtime.scheduler.log
                   for batch in job.batches]
        assert len(batches) == 1 and sorted(batches[0]) == sorted(server.fleet.robots), batches
        for own, answer in zip(alone, together):
            np.testing.assert_allclose(answer, own, atol=1e-4)


SLO_S = 1.0


def test_a_request_whose_deadline_passes_in_the_queue_is_an_error_to_its_client_and_serving_goes_on(monkeypatch):
    """Batches of one. The first client's act is held until the second client's request is queued behind it and
    that request's deadline has passed: the second client is told its request expired, the first gets its chunk
    marked late, and both are served afterwards."""
    with serving(max_clients=2, max_batch=1, slo_s=SLO_S) as (server, connect):
        runtime = server.fleet.runtime
        runner = runtime.runners[MODEL_ID]
        first, second = connect(), connect()
        queued, in_act, second_queued = [], threading.Event(), threading.Event()
        submit, act = runtime.submit, runner.act

        def recording_submit(frame):
            submit(frame)
            queued.append(frame)
            if len(queued) == 2:
                second_queued.set()
            return frame

        def held_act(*args, **kwargs):
            if not in_act.is_set():  # the first act only
                in_act.set()
                second_queued.wait(TIMEOUT_S)
                while queued[1:] and runtime.clock() <= queued[1].deadline:
                    time.sleep(0.005)
            return act(*args, **kwargs)

        monkeypatch.setattr(runtime, "submit", recording_submit)
        monkeypatch.setattr(runner, "act", held_act)
        held = Background(lambda: first.infer(ask(0, "pick")))
        assert in_act.wait(TIMEOUT_S)
        with pytest.raises(RuntimeError, match=r"refused the request \(expired\): not computed within its 1000 ms "
                                               r"deadline \(--slo-ms\): the server is busy"):
            second.infer(ask(1, "place"))
        late = held.join()
        assert late["deadline_missed"] is True and np.isfinite(late["actions"]).all()

        assert [frame.robot_id for frame in queued] == ["client0", "client1"]
        assert server.fleet.robot_counts("client0").late_done == 1
        assert server.fleet.robot_counts("client1").expired_in_queue == 1
        assert server.refused["expired"] == 1
        for policy, seed in ((first, 2), (second, 3)):  # nothing held now: both are served
            assert np.isfinite(policy.infer(ask(seed, "again"))["actions"]).all()
        assert server.fleet.robot_counts("client1").expired_in_queue == 1 and server.refused["expired"] == 1


def test_a_client_that_never_asks_for_text_pays_nothing_for_it(monkeypatch):
    """Requests without `narrate`: no language request is made, no prefill computes the text head's input, no
    decode step runs. Then one request asks, and the same spies see all three."""
    with serving(max_clients=2, max_batch=2, slo_s=60.0) as (server, connect):
        runtime = server.fleet.runtime
        runner = runtime.runners[MODEL_ID]
        requests, hidden, decodes = [], [], []
        new_request_id, prefill, decode = runtime.scheduler.new_request_id, runner.model.prefill, runner.decode

        def spied_new_request_id():
            requests.append(new_request_id())
            return requests[-1]

        def spied_prefill(*args, want_hidden=False, **kwargs):
            hidden.append(want_hidden)
            return prefill(*args, want_hidden=want_hidden, **kwargs)

        def spied_decode(batch):
            decodes.append(len(batch))
            return decode(batch)

        monkeypatch.setattr(runtime.scheduler, "new_request_id", spied_new_request_id)
        monkeypatch.setattr(runner.model, "prefill", spied_prefill)
        monkeypatch.setattr(runner, "decode", spied_decode)
        first, second = connect(), connect()
        replies = [policy.infer(ask(seed, "pick", newest_narration=True))
                   for seed in range(3) for policy in (first, second)]
        assert runtime.drain(TIMEOUT_S)
        assert len(hidden) == len(replies) and not any(hidden)  # one prefill per request, none for text
        assert requests == [] and decodes == [] and runtime.tokens_generated == 0
        assert runtime.stats().active_requests == 0 and runtime.scheduler.requests_dropped == 0
        assert not any("narration" in r or "newest_narration" in r for r in replies)

        first.infer(ask(5, "pick", narrate=True))  # the spies see text work when there is some
        assert runtime.drain(TIMEOUT_S)
        assert requests == [1] and hidden[-1] is True and decodes and runtime.tokens_generated > 0


def test_serve_normalizes_with_the_users_stats_and_refuses_an_unknown_mode_in_one_line(tmp_path, monkeypatch):
    from test_vla_node_checkpoint_startup import base_checkpoint, dataset_stats

    from oxygen_ros.model.tokenizer import train_tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = base_checkpoint(tmp_path / "base")  # as lerobot/pi05_base: no stats of its own
    train_tokenizer(folder / "tokenizer.model", 1024)
    stats = dataset_stats(tmp_path / "norm_stats.json", openpi=True)
    base = [f"model.checkpoint={folder}", "embodiment=aloha", "model.dtype=float32", "model.cpu_kernel=off"]
    with pytest.raises(ValueError, match="no normalization stats for observation.state"):
        build_server(engine_parameters([], base), ServeConfig(port=0), Capacity())
    server = build_server(engine_parameters([], [*base, f"model.norm_stats={stats}", "model.norm_mode=MEAN_STD"]),
                          ServeConfig(port=0), Capacity())
    try:
        norm = server.fleet.runtime.served[MODEL_ID].norm_stats
        assert norm.modes == {"observation.state": "MEAN_STD", "action": "MEAN_STD"}
        np.testing.assert_array_equal(norm["action"]["std"], [0.3] * 14)
    finally:
        server.close()
    with pytest.raises(ValueError, match=r"^model.norm_mode must be empty \(the checkpoint's\) or one of "
                                         r"MEAN_STD \| MIN_MAX") as err:
        build_server(engine_parameters([], [*base, f"model.norm_stats={stats}", "model.norm_mode=ZSCORE"]),
                     ServeConfig(port=0), Capacity())
    assert "\n" not in str(err.value)
def aloha_ask(state: np.ndarray) -> dict:
    """ALOHA's request (two 32 x 32 cameras, 14 joints) with fixed flow-matching noise: a repeatable answer."""
    image = np.zeros((3, 32, 32), np.uint8)
    noise = np.random.default_rng(7).normal(size=(HORIZON, ACTION_DIM)).astype(np.float32)
    return {"state": state, "images": {"cam_high": image, "cam_left_wrist": image}, "prompt": "pick", "noise": noise}


@contextmanager
def aloha_server(*limits: str):
    """A started ALOHA server (the tiny preset's random weights) with the output parameters `limits`; a client."""
    names = ",".join(ALOHA_JOINT_NAMES)
    p = engine_parameters([], ["embodiment=aloha", "model.dtype=float32", "model.cpu_kernel=off",
                               f"joints.action_names=[{names}]", *limits])
    server = build_server(p, ServeConfig(port=0), Capacity(1, 1, 60.0)).start()
    policy = WebsocketClientPolicy("127.0.0.1", server.port)
    try:
        yield policy
    finally:
        policy._ws.close()
        server.close()


def test_joint_limits_given_to_the_server_clamp_or_refuse_every_reply():
    """Without output parameters a reply is the model's; with a group's limits (as the VLA node's `output.*`) the
    same request's reply has that joint clamped into its range and every other joint unchanged, and with
    `limits.policy: reject` it is refused with the reason; a start-up without the joints named is one error."""
    state = np.zeros(14)
    waist = ALOHA_JOINT_NAMES.index("left_waist")
    group = ["output.groups=[waist]", "output.waist.joints=[left_waist]", "output.waist.lower=-0.001",
             "output.waist.upper=0.001"]
    with aloha_server() as policy:
        free = policy.infer(aloha_ask(state))["actions"]
    assert np.abs(free[:, waist]).max() > 0.001  # random weights: far outside the range below
    with aloha_server(*group) as policy:
        clamped = policy.infer(aloha_ask(state))["actions"]
    assert np.abs(clamped[:, waist]).max() <= 0.001 + 1e-9
    np.testing.assert_allclose(np.delete(clamped, waist, axis=1), np.delete(free, waist, axis=1), atol=1e-6)
    with aloha_server(*group, "limits.policy=reject") as policy, \
            pytest.raises(RuntimeError, match=r"refused the request \(limits\): plan refused \(range limit"):
        policy.infer(aloha_ask(state))
    with pytest.raises(ValueError, match="output.groups: the groups' joints are named in joints.action_names"):
        build_server(engine_parameters([], ["embodiment=aloha", *group]), ServeConfig(port=0), Capacity())
