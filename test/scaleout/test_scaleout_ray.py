"""The pool on a real multi-node Ray cluster in this machine (`ray.cluster_utils.Cluster`: a head and two worker
nodes, each its own raylet and worker processes), with the real `openpi-client` through Serve's ingress: joins
refused with their reason, chunks fenced by placement epoch, and a worker node killed under robots, which are
served again from the other replica, no robot ever commanded by two replicas; and the controller's process killed:
Ray starts it again, it takes the routes back from the replicas, and nobody moves.

One cluster for the module (Ray and Serve start in tens of seconds on a loaded 2-core machine); the failover test
kills a node, so it runs last."""

import socket
import threading
import time

import pytest
import ray
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from ray import serve
from ray.cluster_utils import Cluster
from test_replay_node import Child
from test_vla_node_embodiment import CAMERAS as DROID_CAMERAS
from test_vla_node_embodiment import DROID
from test_vla_node_embodiment import JOINTS as DROID_JOINTS
from test_vla_node_ros import REPO, STARTUP_TIMEOUT_S, Spinner, wait_until
from trajectory_msgs.msg import JointTrajectory
from websockets.exceptions import ConnectionClosedError

from oxygen_ros.commands.bench_client import droid_request
from oxygen_ros.nodes.latency_probe import SensorPublisher
from oxygen_ros.scaleout.deployments import ACTIVE_S, APP
from oxygen_ros.scaleout.pool import PoolConfig, start_pool
from oxygen_ros.serving.fence import ChunkFence
from oxygen_ros.serving.protocol import pack, unpack

pytestmark = pytest.mark.system
KEY = "test-key"
DEADLINE_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def pool():
    started = time.perf_counter()
    # pytest-xdist may run this module's tests on two workers: two clusters (Ray takes free ports when its default
    # ones are taken), neither with a dashboard
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head": 100},
                                                            "include_dashboard": False})
    nodes = {f"replica{i}": cluster.add_node(num_cpus=1, resources={f"slot{i}": 1}) for i in range(2)}
    ray.init(address=cluster.address, logging_level="WARNING")
    port = free_port()
    config = PoolConfig(("a=tiny:0", "b=tiny:1", "z=missing_model_config.json"), "droid", replicas=2, max_robots_per_replica=3, port=port,
                        api_key=KEY, max_batch=2, replica_options=({"resources": {"slot0": 1}},
                                                                   {"resources": {"slot1": 1}}),
                        ingress_options={"resources": {"head": 1}}, controller_options={"resources": {"head": 1}})
    controller = start_pool(config)
    print(f"cluster and pool up in {time.perf_counter() - started:.1f} s")
    yield {"cluster": cluster, "nodes": nodes, "controller": controller, "port": port}
    ray.shutdown()
    cluster.shutdown()


def connect(pool, robot_id: str, model: str, key: str | None = KEY, slo_ms: float = 2000) -> WebsocketClientPolicy:
    return WebsocketClientPolicy(f"ws://127.0.0.1:{pool['port']}/robots/{robot_id}?model={model}&rate_hz=5"
                                 f"&slo_ms={slo_ms:g}", api_key=key)


def status(pool) -> dict:
    return ray.get(pool["controller"].status.remote())


def wait_for(condition, what: str, pool=None, robots=()):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + (f"; {status(pool)}" if pool else "") \
            + "".join(f"; {robot.robot_id}: {robot.errors[-2:]} {robot.admitted[-2:]}" for robot in robots)
        time.sleep(0.1)


def test_robots_reach_the_pool_with_openpi_client_and_joins_are_refused_with_their_reason(pool):
    with pytest.raises(ConnectionClosedError, match="API key"):
        connect(pool, "nokey", "a", key=None)
    with pytest.raises(ConnectionClosedError, match="unknown model 'zzz'"):
        connect(pool, "lost", "zzz")
    with pytest.raises(ConnectionClosedError, match="rate_hz must be a positive number"):
        WebsocketClientPolicy(f"ws://127.0.0.1:{pool['port']}/robots/bad?model=a&rate_hz=-1&slo_ms=100", api_key=KEY)
    first, second = connect(pool, "ra", "a"), connect(pool, "rb", "b")
    try:
        meta_a, meta_b = first.get_server_metadata(), second.get_server_metadata()
        assert meta_a["replica"] != meta_b["replica"]  # the MILP's lowest load: one model per replica
        for policy, meta in ((first, meta_a), (second, meta_b)):
            fence = ChunkFence()
            reply = policy.infer(droid_request(1, size=32))
            assert reply["actions"].shape == (8, 8)
            assert reply["placement"] == {"epoch": meta["epoch"], "replica": meta["replica"]} and fence.admit(reply)
        first._ws.send("not msgpack")
        assert "expected a binary msgpack message" in first._ws.recv()
        routes = status(pool)["routes"]
        assert routes["ra"]["replica"] == meta_a["replica"] and routes["rb"]["replica"] == meta_b["replica"]
    finally:
        first._ws.close()
        second._ws.close()
    wait_for(lambda: not status(pool)["routes"], "the robots to leave with their connections")


def test_a_chunk_from_the_replica_a_robot_was_moved_away_from_is_dropped_by_the_robot(pool):
    policy = connect(pool, "rf", "a")
    try:
        meta = policy.get_server_metadata()
        fence = ChunkFence()
        assert fence.admit(policy.infer(droid_request(2, size=32)))
        old = serve.get_deployment_handle(meta["replica"], APP)
        route = ray.get(pool["controller"].route.remote("rf"))  # the route the ingress sent its request with
        assert (route["replica"], route["epoch"]) == (meta["replica"], meta["epoch"])
        # A chunk the old owner computes for the robot, still on its way (a slow link, a partition) ...
        late = old.infer.remote(route, pack(droid_request(3, size=32))).result(timeout_s=60)
        # ... when the robot is moved (here: its replica refuses it, and the controller places it elsewhere)
        answer = ray.get(pool["controller"].refused.remote("rf", meta["replica"], meta["epoch"], "test: moved"))
        assert answer["accepted"] and answer["server"] != meta["replica"]
        fresh = policy.infer(droid_request(4, size=32))
        assert fresh["placement"] == {"epoch": answer["version"], "replica": answer["server"]}
        assert fence.admit(fresh)
        stale = unpack(late["reply"])
        assert stale["placement"] == {"epoch": meta["epoch"], "replica": meta["replica"]}
        assert not fence.admit(stale) and fence.dropped == {"stale_epoch": 1}
        # the old replica, told by the controller, refuses requests routed before the move
        wait_for(lambda: "error" in old.infer.remote(route, pack(droid_request(5, size=32))).result(timeout_s=60),
                 "the old replica to let the robot go", pool)
    finally:
        policy._ws.close()
    wait_for(lambda: not status(pool)["routes"], "the robot to leave")


def test_a_ros_robot_reaches_the_pool_through_the_ingress_with_the_vla_nodes_remote_engine(
        pool, ros_context, ros_env, model_cache):
    """The VLA node (config/droid.yaml, armed) with `engine.remote` on the ingress: it joins with its URL's query,
    its chunks carry the placement its fence holds, they go out on action_chunk; its exit is the robot's leave."""
    robot = rclpy.create_node("droid_side", context=ros_context)
    sensors = SensorPublisher(robot, DROID_CAMERAS, DROID_JOINTS)
    chunks, diagnostics = [], []
    robot.create_subscription(JointTrajectory, "action_chunk", chunks.append, 100)
    robot.create_subscription(DiagnosticArray, "/diagnostics", lambda msg: diagnostics.extend(
        {kv.key: kv.value for kv in status.values} for status in msg.status if status.name == "/vla_node: vla engine"),
        100)
    spinner = Spinner(ros_context, [robot])
    url = f"ws://127.0.0.1:{pool['port']}/robots/rros?model=a&rate_hz=5&slo_ms=2000"
    child = Child(["-m", "oxygen_ros.nodes.vla_node", "--ros-args", "--params-file", str(DROID), "--params-file",
                   str(REPO / "test" / "fixtures" / "armed.yaml"), "-p", f"engine.remote:={url}", "-p", "engine.timeout_s:=10.0",
                   "-p", "control.rate_hz:=5.0", "-p", "control.max_image_age_s:=1.0",
                   "-p", "control.max_state_age_s:=1.0", "-p", "instruction.default:=pick up the cube"],
                  dict(ros_env, XDG_CACHE_HOME=str(model_cache), OXYGEN_ROS_API_KEY=KEY))

    def commanded() -> bool:
        sensors.publish_frame()
        time.sleep(1 / 20)
        return len(chunks) >= 3

    try:
        assert wait_until(commanded, STARTUP_TIMEOUT_S, child), child.stop()[1]
        route = status(pool)["routes"]["rros"]
        assert wait_until(lambda: commanded() and diagnostics[-1:] and int(diagnostics[-1]["remote_chunks"]) >= 3,
                          30), diagnostics[-1:]
        assert diagnostics[-1]["placement"] == f"{route['replica']}@{route['epoch']}", (diagnostics[-1], route)
        assert diagnostics[-1]["remote_fenced"] == "0" and diagnostics[-1]["state"] == "running", diagnostics[-1]
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot])
    assert rc == 0, output
    assert list(chunks[-1].joint_names) == DROID_JOINTS and "remote engine ws://127.0.0.1" in output
    wait_for(lambda: "rros" not in status(pool)["routes"], "the ROS robot to leave with its node", pool)


def test_a_robot_whose_model_no_replica_loads_is_placed_again_then_refused_with_the_reason(pool):
    policy = connect(pool, "rz", "z")  # the placement knows model z; no replica can load it
    try:
        first = policy.get_server_metadata()["replica"]
        with pytest.raises(RuntimeError, match=f"replica {first} refused the request \\(refused\\)"):
            policy.infer(droid_request(6, size=32))
        second = status(pool)["routes"]["rz"]["replica"]
        assert second != first
        with pytest.raises(RuntimeError, match=f"the pool cannot serve robot rz: replica {second} refused it .*; "
                                               "no other live replica"):
            policy.infer(droid_request(7, size=32))
        assert "rz" not in status(pool)["routes"]
    finally:
        policy._ws.close()


class Robot(threading.Thread):
    """A robot's loop: a request every `period_s`, each reply through its fence; what came back, with times."""

    def __init__(self, pool, robot_id: str, model: str, period_s: float = 0.2):
        super().__init__(daemon=True)
        self.policy = connect(pool, robot_id, model)
        self.robot_id, self.period_s = robot_id, period_s
        self.fence = ChunkFence()
        self.admitted: list[tuple[float, int, str]] = []  # (time, epoch, replica)
        self.errors: list[tuple[float, str]] = []
        self.stop = threading.Event()

    def run(self):
        seed = 0
        while not self.stop.is_set():
            seed += 1
            try:
                reply = self.policy.infer(droid_request(seed, size=32))
            except RuntimeError as err:  # openpi-client: the server's text error
                self.errors.append((time.time(), str(err)[:200]))
            else:
                if self.fence.admit(reply):
                    self.admitted.append((time.time(), reply["placement"]["epoch"], reply["placement"]["replica"]))
            time.sleep(self.period_s)

    def close(self):
        self.stop.set()
        self.join(30)
        self.policy._ws.close()


def test_the_controller_process_killed_comes_back_with_the_routes_and_nobody_moves(pool):
    robots = [Robot(pool, "c1", "a"), Robot(pool, "c2", "b")]
    for robot in robots:
        robot.start()
    try:
        wait_for(lambda: all(robot.admitted for robot in robots), "every robot's first chunk")
        before = status(pool)["routes"]
        time.sleep(ACTIVE_S)  # the robot of the test before, gone, is now quiet for longer than a restore looks back
        killed = time.time()
        ray.kill(pool["controller"], no_restart=False)  # its process dies; Ray starts it again

        def recovered():
            try:
                return "recovered_robots" in status(pool)["counts"]
            except ray.exceptions.RayError:
                return False

        wait_for(recovered, "the controller to take the routes back")
        back_at = time.time() - killed
        assert status(pool)["routes"] == before
        wait_for(lambda: all(t > killed + back_at for robot in robots for t, _, _ in robot.admitted[-1:]),
                 "chunks after the recovery", pool, robots)
    finally:
        for robot in robots:
            robot.close()
    lost = {robot.robot_id: sum(1 for t, _ in robot.errors if t > killed) for robot in robots}
    print(f"controller restart: routes back after {back_at:.2f} s; requests lost {lost}")
    for robot in robots:
        assert {(epoch, replica) for _, epoch, replica in robot.admitted} == \
            {(before[robot.robot_id]["epoch"], before[robot.robot_id]["replica"])}  # nobody moved
        assert not robot.fence.dropped
    wait_for(lambda: not status(pool)["routes"], "the robots to leave")


def test_a_node_killed_under_robots_its_robots_are_served_again_by_the_other_replica(pool):
    # both replicas live first: a controller restarted by the test before takes them back as they answer its probes
    wait_for(lambda: status(pool)["alive"] == ["replica0", "replica1"], "both replicas live", pool)
    robots = [Robot(pool, "r1", "a"), Robot(pool, "r2", "a"), Robot(pool, "r3", "b")]
    for robot in robots:
        robot.start()
    try:
        wait_for(lambda: all(robot.admitted for robot in robots), "every robot's first chunk")
        routes = status(pool)["routes"]
        victim = routes["r1"]["replica"]
        assert routes["r2"]["replica"] == victim != routes["r3"]["replica"]  # fewest (model, replica) pairs
        killed = time.time()
        pool["cluster"].remove_node(pool["nodes"][victim])
        back = lambda robot: [t for t, _, replica in robot.admitted if t > killed and replica != victim]  # noqa: E731
        wait_for(lambda: back(robots[0]) and back(robots[1]), "the moved robots to be served again", pool, robots)
        served_again = {robot.robot_id: back(robot)[0] - killed for robot in robots[:2]}
        time.sleep(1.0)  # a few more chunks everywhere
    finally:
        for robot in robots:
            robot.close()
    after = status(pool)
    lost = {robot.robot_id: sum(1 for t, _ in robot.errors if t > killed) for robot in robots}
    print(f"failover: served again after {served_again} s; requests lost after the kill {lost}; "
          f"controller events {after['events'][-2:]}")
    for robot in robots:
        epochs = [(epoch, replica) for _, epoch, replica in robot.admitted]
        assert epochs == sorted(epochs, key=lambda item: item[0])  # an epoch never goes back
        owners: dict[int, set[str]] = {}
        for epoch, replica in epochs:
            owners.setdefault(epoch, set()).add(replica)
        assert all(len(replicas) == 1 for replicas in owners.values())  # one replica per epoch
        assert not robot.fence.dropped  # nothing from a replica that lost the robot reached it
    for robot in robots[:2]:
        assert not [t for t, _, replica in robot.admitted if t > killed + served_again[robot.robot_id]
                    and replica == victim]  # after the move, only the new owner
    untouched = robots[2]
    assert {epoch for _, epoch, _ in untouched.admitted} == {untouched.admitted[0][1]}  # r3 never moved
    assert lost["r3"] == 0
    assert [victim, "down"] in [list(event[1:]) for event in after["events"]]
