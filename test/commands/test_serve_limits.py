"""`oxygen-ros serve` against hostile and idle clients: what one message may cost the server once decoded, how long
its refusals may be, how long an idle connection keeps its slot, and the start-up options that cannot work.

One server process for this module (the tiny preset, the `absolute` profile, so that a state of any width is
read; the default 32 MB message limit; two client slots; a 10 s idle timeout), the real `openpi-client` for the
good client and a plain websocket for the bytes no real client sends. The server's memory is read from
/proc/PID/status: its peak (VmHWM) is reset through /proc/PID/clear_refs before the hostile messages, so the peak
read after them is what they cost."""

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_process import REPO, ServeProcess
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_ros.commands.serve import main as serve_main

pytestmark = pytest.mark.system
IDLE_TIMEOUT_S = 10.0
MAX_CLIENTS = 2
TIMEOUT_S = 120.0
MAX_REPLY_CHARS = 1000  # a refusal's text, and any line the server logs
# What the hostile messages below may add to the server's peak memory, the 31 MB messages themselves in the
# websocket's buffers included (docs/serve.md, "Bad input": 130 MB measured for all three here; before the object
# budget the first one alone took 2.2 GB, issue 45).
MAX_PEAK_GROWTH_MB = 200
M1_ITEMS = 31 * 2**20  # the message: an array of 31 M empty maps, 31 MB on the wire


@pytest.fixture(scope="module")
def served():
    server = ServeProcess("--preset", "tiny", "--embodiment", "absolute", "-p", "model.dtype=float32",
                          "-p", "model.cpu_kernel=off", "--max-clients", str(MAX_CLIENTS), "--slo-ms", "60000",
                          "--idle-timeout-s", str(IDLE_TIMEOUT_S))
    try:
        server.wait_ready()
        yield server
    finally:
        rc, output = server.stop()
    assert rc == 0, output


def request(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"observation/state": np.linspace(-0.5, 0.5, 8), "prompt": "pick up the cube",
            "observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
            "noise": rng.normal(size=(8, 16)).astype(np.float32)}


def raw(server: ServeProcess):
    """A plain websocket connection (for bytes the real client cannot send), its metadata read."""
    ws = websockets.sync.client.connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None)
    msgpack_numpy.unpackb(ws.recv())
    return ws


def memory_mb(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1)) / 1024


def hostile_messages() -> dict[str, bytes]:
    """Each under the 32 MB limit, each gigabytes of Python objects if decoded whole."""
    nested = 480  # arrays of 65,535 items each: no single array is long, all of them together are
    return {
        "the issue's array of empty maps": b"\xdd" + M1_ITEMS.to_bytes(4, "big") + b"\x80" * M1_ITEMS,
        "nested arrays of empty maps": b"\xdc" + nested.to_bytes(2, "big")
        + (b"\xdc\xff\xff" + b"\x80" * 0xFFFF) * nested,
        "nested arrays of two-character strings": b"\xdc" + (32).to_bytes(2, "big")
        + (b"\xdc\xff\xff" + b"\xa2ab" * 0xFFFF) * 32,
    }


def test_messages_that_decode_into_millions_of_objects_are_refused_cheaply(served):
    server = served
    good = WebsocketClientPolicy("127.0.0.1", server.port)
    ws = None
    try:
        expected = good.infer(request())["actions"]
        pid = server.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = memory_mb(pid, "VmHWM")
        ws = raw(server)
        for name, message in hostile_messages().items():
            ws.send(message)
            reply = ws.recv(timeout=TIMEOUT_S)
            assert isinstance(reply, str) and len(reply) < MAX_REPLY_CHARS, (name, reply[:MAX_REPLY_CHARS])
            assert reply.startswith("oxygen-ros serve refused the request (malformed): the message is too large "
                                    "once decoded: "), (name, reply)
            np.testing.assert_allclose(good.infer(request())["actions"], expected, atol=1e-6)
        ws.send(msgpack_numpy.packb(request()))  # the connection goes on
        np.testing.assert_allclose(msgpack_numpy.unpackb(ws.recv(timeout=TIMEOUT_S))["actions"], expected,
                                   atol=1e-6)
        growth = memory_mb(pid, "VmHWM") - before
        print(f"server peak memory before the hostile messages {before:.0f} MB, growth {growth:.0f} MB")
        assert growth < MAX_PEAK_GROWTH_MB, growth
    finally:
        good._ws.close()
        if ws is not None:
            ws.close()
    assert server.alive()


def test_refusals_and_log_lines_never_echo_a_huge_input(served):
    """The issue's 30 MB float16 state with a NaN, and a `narrate` flag of 3 M items: short refusals, short logs."""
    server = served
    ws = raw(server)
    state = np.zeros(15_700_000, dtype=np.float16)
    state[7] = np.nan
    cases = {"state_shape": dict(request(), **{"observation/state": state}),
             "malformed": dict(request(), narrate=list(range(3_000_000)))}
    for reason, obs in cases.items():
        ws.send(msgpack_numpy.packb(obs))
        reply = ws.recv(timeout=TIMEOUT_S)
        assert isinstance(reply, str) and len(reply) < MAX_REPLY_CHARS, reply[:MAX_REPLY_CHARS]
        assert reply.startswith(f"oxygen-ros serve refused the request ({reason})"), reply
    ws.send(msgpack_numpy.packb(dict(request(), narrate=list(range(1000)))))  # a list within the object budget
    reply = ws.recv(timeout=TIMEOUT_S)
    assert reply == "oxygen-ros serve refused the request (bad_flag): narrate must be true or false, got a list " \
                    "of 1000 items"
    left = server.output.count(" left (")
    ws.close()
    deadline = time.monotonic() + TIMEOUT_S
    while server.output.count(" left (") == left and time.monotonic() < deadline:  # its summary as it leaves
        time.sleep(0.1)
    assert max(len(line) for line in server.output.splitlines()) < MAX_REPLY_CHARS
    assert "refused a request (state_shape): the state holds 15700000 values" in server.output


def test_idle_connections_are_closed_and_free_their_slots(served):
    server = served
    opened = time.monotonic()  # before the server's clocks of these connections start
    idle = [raw(server) for _ in range(MAX_CLIENTS)]
    with pytest.raises(InvalidStatus, match="HTTP 503"):
        WebsocketClientPolicy("127.0.0.1", server.port)  # both slots held
    for ws in idle:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=TIMEOUT_S)
        assert closed.value.rcvd.code == 1000 and closed.value.rcvd.reason == f"idle for {IDLE_TIMEOUT_S:g} s"
    assert time.monotonic() - opened >= IDLE_TIMEOUT_S  # not before its time
    policy, deadline = None, time.monotonic() + TIMEOUT_S
    while policy is None:  # a slot is free again as soon as the server's side of the close is done
        try:
            policy = WebsocketClientPolicy("127.0.0.1", server.port)
        except InvalidStatus:
            assert time.monotonic() < deadline, "no slot was freed"
            time.sleep(0.1)
    try:
        assert policy.infer(request())["actions"].shape == (8, 8)
    finally:
        policy._ws.close()
    assert server.output.count(f"no message for {IDLE_TIMEOUT_S:g} s, closing the connection") >= MAX_CLIENTS


@pytest.mark.parametrize(("args", "message"), [
    (("--max-message-mb", "-1"), "argument --max-message-mb: must be a positive number, got -1"),
    (("--max-message-mb", "0"), "argument --max-message-mb: must be a positive number, got 0"),
    (("--max-message-mb", "inf"), "argument --max-message-mb: must be a positive number, got inf"),
    (("--port", "70000"), "argument --port: must be a TCP port from 0 to 65535, got 70000"),
    (("--idle-timeout-s", "0"), "argument --idle-timeout-s: must be a positive number, got 0"),
])
def test_options_that_cannot_work_are_one_line_at_start(args, message, capsys):
    with pytest.raises(SystemExit) as ended:
        serve_main(["--preset", "tiny", *args])
    assert ended.value.code == 2
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [f"oxygen-ros serve: error: {message} (see --help)"], printed.err
    assert printed.out == ""


def test_an_option_that_cannot_work_ends_the_command_with_status_2_and_one_line():
    """The same through the `oxygen-ros` entry point, as its own process (one case: each process loads torch)."""
    result = subprocess.run([sys.executable, "-m", "oxygen_ros.commands.cli", "serve", "--preset", "tiny",
                             "--port", "70000"], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.splitlines() == ["oxygen-ros serve: error: argument --port: must be a TCP port from 0 to "
                                          "65535, got 70000 (see --help)"], result.stderr
    assert result.stdout == ""
